"""A test-time (transductive) arm, materialized in-process with the tiny models: its eval report judges the
transductive and the transfer problems apart, with TTRL's yardstick; the gold-label control refuses to train on it.
(That its hidden eval gold reaches no sample, label, reward or weight: tests/integration/test_leakage.py.)"""

from __future__ import annotations

import dagster as dg
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.reporting.eval_report import read_published_eval
from noisy_student_assets.core.reporting.test_time import YARDSTICK_TABLE
from tests.lakes import materialize, metadata_of
from tests.tiny_configs import N_LABELED, op, round_names, tiny_config, with_op_config

ARM = "a"
TEST_TIME_UNLABELED = 3
"""The tiny eval set's transductive half: 3 of its 5 problems."""
UNLABELED = dg.AssetKey(layout.UNLABELED_PROBLEMS)
LABELED_ONLY = layout.control_checkpoint(layout.LABELED_ONLY)


def test_a_test_time_report_judges_each_eval_set_beside_ttrl_s_yardstick(sevens_lake_copy, sevens_model_dir) -> None:
    lake = sevens_lake_copy()
    config = with_op_config(tiny_config(sevens_model_dir), "problem_split", test_time=True)
    grpo = config["ops"][op(layout.round_prefix(1), layout.STUDENT)]["config"]["grpo"]
    config = with_op_config(config, op(layout.round_prefix(1), LABELED_ONLY), grpo=grpo)
    materialize(lake, [layout.UNLABELED_PROBLEMS], config, ARM)
    selection = [layout.BASE_MODEL_EVAL, layout.LABELED_RL_EVAL]
    selection += round_names(1, layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT, LABELED_ONLY)
    selection += round_names(1, layout.control_eval(layout.LABELED_ONLY), layout.EVAL_REPORT)
    result = materialize(lake, selection, config, ARM)

    checks = {(c.asset_key.to_user_string(), c.check_name): c.passed for c in result.get_asset_check_evaluations()}
    assert checks[("/".join(layout.round_asset(1, LABELED_ONLY)), "compute_matched")]
    assert (
        lake.read_table(dg.AssetKey(layout.LABELED_PROBLEMS), ARM).height == N_LABELED
    )  # labeled RL's problems as ever
    report = metadata_of(result, "/".join(layout.round_asset(1, layout.EVAL_REPORT)))
    assert "**Test-time arm.** 3 of the 5 eval problems are this arm's unlabeled problems" in report["report"].value
    assert (
        "on the transductive problems" in report["report"].value
        and "on the transfer problems" in report["report"].value
    )
    published = read_published_eval(lake.artifact_dir(dg.AssetKey(layout.round_asset(1, layout.EVAL_REPORT)), ARM))
    for name in (
        "transductive/greedy_accuracy",
        "transfer/greedy_accuracy",
        "verdict/transductive/difference",
        "verdict/transfer/ci_high",
    ):
        assert name in published.metrics, name
    yardstick = published.table(YARDSTICK_TABLE).row(0, named=True)
    audit = metadata_of(result, "/".join(layout.round_asset(1, layout.PSEUDO_LABELS)))
    assert yardstick["problems"] == TEST_TIME_UNLABELED
    assert (
        yardstick["teacher_maj_at_k"] == audit["teacher_maj_at_k"].value
        and yardstick["teacher_pass_at_k"] == audit["teacher_pass_at_k"].value
    )
    transductive = published.scores.filter(
        pl.col("problem_id").is_in(lake.read_table(UNLABELED, ARM)["problem_id"].implode())
    )
    assert (
        yardstick["student_greedy"]
        == published.metrics["transductive/greedy_accuracy"]
        == transductive["greedy_correct"].mean()
    )

    gold = round_names(1, layout.control_checkpoint(layout.GOLD_LABEL))
    refused = materialize(lake, gold, config, ARM, raise_on_error=False)
    failure = next(e for e in refused.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert "3 of arm a's unlabeled problems are held-out eval problems" in failure.event_specific_data.error.message
