"""A test-time arm's reports: the held-out set split into the problems it trained on (transductive) and the fixed
other half (transfer), per-set verdicts pooled over seeds, and TTRL's yardstick (no model: tables by hand)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import ArmSpec, Experiment
from noisy_student_assets.core.problems import eval_halves
from noisy_student_assets.core.reporting import test_time
from noisy_student_assets.core.reporting.summary import collect, summary_markdown
from noisy_student_assets.core.reporting.test_time import ALL_EVAL
from tests.unit.test_summary import AUDIT, COMPUTE, _eval, write_audit

PROBLEMS = 40
EVAL = pl.DataFrame(
    {"problem_id": [f"p{i:02d}" for i in range(PROBLEMS)], "prompt": [f"q{i}" for i in range(PROBLEMS)]}
)
TRANSDUCTIVE_HALF, TRANSFER_HALF = (set(half["problem_id"]) for half in eval_halves(EVAL))


def test_only_an_arm_that_took_eval_problems_gets_eval_sets() -> None:
    assert test_time.eval_sets(EVAL, pl.Series(["pool/1", "pool/2"])).is_empty()
    sets = test_time.eval_sets(EVAL, pl.Series(sorted(TRANSDUCTIVE_HALF)))
    by_set = {name: set(group["problem_id"]) for (name,), group in sets.group_by("eval_set")}
    assert by_set == {test_time.TRANSDUCTIVE: TRANSDUCTIVE_HALF, test_time.TRANSFER: TRANSFER_HALF}
    some = sorted(TRANSDUCTIVE_HALF)[:3]  # the rest of the transductive half is in neither set
    sets = test_time.eval_sets(EVAL, pl.Series(some))
    assert set(sets.filter(pl.col("eval_set") == test_time.TRANSDUCTIVE)["problem_id"]) == set(some)
    assert set(sets.filter(pl.col("eval_set") == test_time.TRANSFER)["problem_id"]) == TRANSFER_HALF


def test_the_yardstick_is_measured_on_the_transductive_problems_alone() -> None:
    sets = test_time.eval_sets(EVAL, pl.Series(sorted(TRANSDUCTIVE_HALF)))

    def scores(correct: set[str]) -> pl.DataFrame:
        return EVAL.select("problem_id", pl.col("problem_id").is_in(sorted(correct)).alias("greedy_correct"))

    audit = AUDIT.model_copy(update={"teacher_maj_at_k": 0.6, "teacher_pass_at_k": 0.9, "teacher_pass_at_1": 0.5})
    teacher = scores(set(sorted(TRANSDUCTIVE_HALF)[:5]) | TRANSFER_HALF)  # the transfer half must not count
    row = test_time.yardstick(audit, teacher, scores(TRANSDUCTIVE_HALF), scores(set()), sets).row(0, named=True)
    assert row == {
        "problems": len(TRANSDUCTIVE_HALF),
        "teacher_greedy": pytest.approx(5 / len(TRANSDUCTIVE_HALF)),
        "teacher_maj_at_k": 0.6,
        "teacher_pass_at_k": 0.9,
        "teacher_sampled_pass_at_1": 0.5,
        "student_greedy": 1.0,
        "labeled_only_greedy": 0.0,
    }


def test_set_differences_judge_each_set_only_where_every_seed_has_sets() -> None:
    sets = test_time.eval_sets(EVAL, pl.Series(sorted(TRANSDUCTIVE_HALF)))

    def scores(correct: set[str]) -> pl.DataFrame:
        return EVAL.select("problem_id", pl.col("problem_id").is_in(sorted(correct)).alias("greedy_correct"))

    one_seed = test_time.set_differences(
        [(scores(TRANSFER_HALF), scores(set()), sets)], treatment_name="s", control_name="c"
    )
    assert {name: d.estimate for name, d in one_seed.items()} == {
        ALL_EVAL: len(TRANSFER_HALF) / PROBLEMS,
        "transductive": 0.0,
        "transfer": 1.0,
    }
    assert one_seed["transfer"].treatment == "s on the transfer problems" and one_seed["transfer"].problems == len(
        TRANSFER_HALF
    )
    mixed = [(scores(TRANSFER_HALF), scores(set()), sets), (scores(TRANSFER_HALF), scores(set()), None)]
    assert list(test_time.set_differences(mixed, treatment_name="s", control_name="c")) == [ALL_EVAL]
    one_problem = EVAL.head(1)  # its transductive half is all of it: no transfer problem
    sets = test_time.eval_sets(one_problem, one_problem["problem_id"])
    single = [
        (
            one_problem.select("problem_id", pl.lit(True).alias("greedy_correct")),
            one_problem.select("problem_id", pl.lit(False).alias("greedy_correct")),
            sets,
        )
    ]
    assert list(test_time.set_differences(single, treatment_name="s", control_name="c")) == [ALL_EVAL, "transductive"]


def _scores_dir(lake: Path, key, arm: str, correct: set[str]) -> None:
    _eval(lake, key, arm, [pid in correct for pid in EVAL["problem_id"]])


def test_a_test_time_group_is_judged_on_each_eval_set_and_pooled_over_seeds(tmp_path: Path) -> None:
    experiment = Experiment(
        name="tt",
        controls=(layout.LABELED_ONLY,),
        arms={f"tt-s{seed}": ArmSpec(test_time=True, seed=seed) for seed in (0, 1)} | {"pool-s0": ArmSpec(seed=0)},
    )
    arms = experiment.all_arms()
    for arm in arms:
        EVAL.write_parquet(_table_path(tmp_path, layout.EVAL_PROBLEMS, arm.name))
        unlabeled = sorted(TRANSDUCTIVE_HALF) if arm.spec.test_time else ["pool/1"]
        pl.DataFrame({"problem_id": unlabeled}).write_parquet(
            _table_path(tmp_path, layout.UNLABELED_PROBLEMS, arm.name)
        )
        _scores_dir(tmp_path, layout.LABELED_RL_EVAL, arm.name, set())
        # the student solves every transductive problem and nothing else; its control solves nothing
        _scores_dir(tmp_path, layout.round_asset(1, layout.EVAL_REPORT), arm.name, TRANSDUCTIVE_HALF)
        _scores_dir(tmp_path, layout.round_asset(1, layout.control_eval(layout.LABELED_ONLY)), arm.name, set())
    results = collect(tmp_path, arms, rounds=1)
    rows = {(r["group"], r["eval_set"]): r for r in results.differences.iter_rows(named=True)}
    assert set(rows) == {
        ("test_time=True", ALL_EVAL),
        ("test_time=True", "transductive"),
        ("test_time=True", "transfer"),
        ("defaults", ALL_EVAL),
    }
    transductive, transfer = rows[("test_time=True", "transductive")], rows[("test_time=True", "transfer")]
    assert (transductive["seeds"], transductive["problems"], transductive["estimate"]) == (
        2,
        len(TRANSDUCTIVE_HALF),
        1.0,
    )
    assert (transfer["problems"], transfer["estimate"], transfer["outcome"]) == (
        len(TRANSFER_HALF),
        0.0,
        "inconclusive",
    )
    assert rows[("test_time=True", ALL_EVAL)]["estimate"] == pytest.approx(len(TRANSDUCTIVE_HALF) / PROBLEMS)
    assert all(row["compute_matched"] for row in rows.values())
    text = summary_markdown(results)
    assert "round 1 (test_time=True) on the transductive problems beats its labeled-only control: +1.000" in text
    assert "round 1 (test_time=True) on the transfer problems is not distinguishable" in text


def _table_path(lake: Path, name: str, arm: str | None) -> Path:
    directory = layout.artifact_dir(lake, name, arm)
    directory.mkdir(parents=True)
    return directory / layout.TABLE_FILE_NAME


def test_the_audit_columns_carry_the_teacher_s_maj_and_pass_at_k_and_a_test_time_student_s_transductive_accuracy(
    tmp_path: Path,
) -> None:
    experiment = Experiment(
        name="tt",
        controls=(layout.LABELED_ONLY,),
        arms={"pool": ArmSpec(seed=0), "tt": ArmSpec(seed=0, test_time=True)},
    )
    for arm, student_metrics in (("pool", {}), ("tt", {"transductive/greedy_accuracy": 0.75})):
        _scores_dir(tmp_path, layout.LABELED_RL_EVAL, arm, set())
        _eval(
            tmp_path, layout.round_asset(1, layout.EVAL_REPORT), arm, [True, False], compute=COMPUTE | student_metrics
        )
        write_audit(tmp_path, arm, teacher_maj_at_k=0.4, teacher_pass_at_k=0.7)
    audits = {
        row["arm"]: row for row in collect(tmp_path, experiment.all_arms(), rounds=1).audits.iter_rows(named=True)
    }
    assert [(audits[arm]["teacher_maj_at_k"], audits[arm]["teacher_pass_at_k"]) for arm in ("pool", "tt")] == [
        (0.4, 0.7)
    ] * 2
    assert (audits["pool"]["student_transductive_greedy"], audits["tt"]["student_transductive_greedy"]) == (None, 0.75)
