"""The label controls of a break-even (issue 75), materialized in-process beside a round's student on a teacher that
answers (`sevens_model_dir`): the dose control trains on the unlabeled problems' true answers with a share dose_rho
made wrong, the kept-gold control on the kept problems' true answers; each records its labels, spends the student's
compute, and the summary places every line by the accuracy of the labels it trained on."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import find_arm
from noisy_student_assets.core.grading import answers_equivalent
from noisy_student_assets.core.lake_reader import ArmLake
from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN
from noisy_student_assets.core.reporting.summary import collect
from noisy_student_assets.defs.partitions import ARMS
from resources.data_lake import DataLake
from tests.lakes import answerable_by_sevens, arms_instance, materialize, metadata_of
from tests.tiny_configs import FOUNDATION, round_chain, tiny_config

ARM = "dose"  # tests/experiments/label_dose.yaml: every control, dose_rho 0.5
EXPERIMENTS = Path(__file__).parents[1] / "experiments"


def _checkpoint(control: str) -> str:
    return "/".join(layout.round_asset(1, layout.control_checkpoint(control)))


def test_the_dose_and_kept_gold_controls_train_on_the_labels_they_name(tmp_path: Path, sevens_model_dir) -> None:
    lake = DataLake(root=str(tmp_path / "lake"))
    config = tiny_config(sevens_model_dir, rounds=1, tau=0.5)
    evals = [layout.UNLABELED_PROBLEMS, layout.VALIDATION_PROBLEMS, layout.BASE_MODEL_EVAL, layout.LABELED_RL_EVAL]
    with arms_instance() as instance:
        instance.add_dynamic_partitions(ARMS.name, [ARM])
        materialize(lake, [*FOUNDATION, *evals], config, ARM, instance=instance)
        answerable_by_sevens(lake, ARM)
        result = materialize(lake, round_chain(1, *layout.CONTROLS), config, ARM, instance=instance)

    unlabeled = lake.read_table(dg.AssetKey(layout.UNLABELED_PROBLEMS), ARM)
    gold = dict(unlabeled.select("problem_id", HIDDEN_GOLD_COLUMN).iter_rows())
    arm_lake = ArmLake(Path(lake.root), ARM)

    def trained_on(control: str) -> pl.DataFrame:
        return arm_lake.checkpoint(layout.round_asset(1, layout.control_checkpoint(control))).training_labels

    dosed = trained_on(layout.DOSE_LABEL)
    wrong = [not answers_equivalent(gold[pid], label) for pid, label in dosed.iter_rows()]
    assert sorted(dosed["problem_id"]) == sorted(gold) and sum(wrong) == round(0.5 * len(gold))
    assert metadata_of(result, _checkpoint(layout.DOSE_LABEL))["labels_made_wrong"].value == sum(wrong)

    labels = lake.read_table(dg.AssetKey(list(layout.round_asset(1, layout.PSEUDO_LABELS))), ARM)
    kept = set(labels.filter("kept")["problem_id"])
    kept_gold = trained_on(layout.KEPT_GOLD_LABEL)
    assert kept and set(kept_gold["problem_id"]) == kept
    assert all(label == gold[pid] for pid, label in kept_gold.iter_rows())
    labeled = lake.read_table(dg.AssetKey(layout.LABELED_PROBLEMS), ARM).height
    assert metadata_of(result, _checkpoint(layout.KEPT_GOLD_LABEL))["gold_rows"].value == labeled + len(kept)

    checks = {(c.asset_key.to_user_string(), c.check_name): c.passed for c in result.get_asset_check_evaluations()}
    for control in layout.CONTROLS:
        assert checks[(_checkpoint(control), "compute_matched")], control

    arm = find_arm(EXPERIMENTS, ARM)
    break_even = collect(Path(lake.root), [arm], 1).break_even
    accuracy = dict(break_even.select("line", "label_accuracy").iter_rows())
    assert accuracy[layout.DOSE_LABEL] == 0.5 and accuracy[layout.GOLD_LABEL] == accuracy[layout.KEPT_GOLD_LABEL] == 1
    assert set(accuracy) == {layout.STUDENT_ROLE, *layout.LABEL_CONTROLS}
    assert break_even["low"].le(break_even["estimate"]).all() and break_even["estimate"].le(break_even["high"]).all()
