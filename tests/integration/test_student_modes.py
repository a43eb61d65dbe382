"""A round's student in each mode (GRPO with the soft reward and noise, SFT, DPO), materialized in-process
beside its labeled-only control on a lake whose teacher answers (`sevens_teacher_lake`)."""

from __future__ import annotations

import dagster as dg
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.training.compute import MATCHED_FIELDS
from tests.lakes import materialize, metadata_of
from tests.tiny_configs import op, round_names, tiny_config, with_op_config

ARM = "a"
STUDENT = "/".join(layout.round_asset(1, layout.STUDENT))
CONTROL = "/".join(layout.round_asset(1, layout.control_checkpoint(layout.LABELED_ONLY)))
STUDENT_OP = op(layout.round_prefix(1), layout.STUDENT)
MODES = {
    "sft": {"mode": "sft", "sft_samples_per_problem": 1},
    "dpo": {"mode": "dpo", "dpo_beta": 0.2},
    "grpo-soft-noisy": {"reward": "vote_share", "prompt_noise": True, "model_dropout": 0.1, "agreement_low": 0.3},
    "grpo-unlabeled-share": {"unlabeled_share": 0.75},
    "grpo-group-majority": {"reward": "group_majority"},
}


@pytest.mark.parametrize("variant", list(MODES))
def test_a_student_of_any_mode_spends_its_labeled_only_control_s_compute(
    variant: str, sevens_lake_copy, sevens_model_dir
) -> None:
    lake = sevens_lake_copy()
    config = tiny_config(sevens_model_dir)
    config = with_op_config(
        config, STUDENT_OP, **MODES[variant], grpo=config["ops"][STUDENT_OP]["config"]["grpo"] | {"max_steps": 2}
    )
    control_op = op(layout.round_prefix(1), layout.control_checkpoint(layout.LABELED_ONLY))
    config = with_op_config(config, control_op, grpo=config["ops"][STUDENT_OP]["config"]["grpo"])
    selection = round_names(
        1, layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT, layout.control_checkpoint(layout.LABELED_ONLY)
    )
    result = materialize(lake, selection, config, ARM)

    student, control = metadata_of(result, STUDENT), metadata_of(result, CONTROL)
    assert student["training_mode"].value == MODES[variant].get("mode", "grpo")
    trained_with = {
        k: v for k, v in MODES[variant].items() if not k.startswith("agreement")
    }  # the band picks the labels
    assert student["student_options"].value == trained_with
    for field in MATCHED_FIELDS:
        assert student[f"compute/{field}"].value == control[f"compute/{field}"].value > 0
        assert student[f"compute/total_{field}"].value == control[f"compute/total_{field}"].value
    checks = {(c.asset_key.to_user_string(), c.check_name): c.passed for c in result.get_asset_check_evaluations()}
    assert checks[(CONTROL, "compute_matched")] and checks[(STUDENT, "finite_weights")]
    if variant == "grpo-unlabeled-share":  # 2 steps x 2 prompts: 3 pseudo-labeled, 1 labeled
        assert (student["train_rows"].value, student["pseudo_rows"].value, student["gold_rows"].value) == (4, 3, 1)
    elif variant == "grpo-group-majority":  # labeled rows keep their gold reward, pseudo rows vote online
        assert student["gold_rows"].value > 0 and student["pseudo_rows"].value > 0
    elif variant == "grpo-soft-noisy":
        assert student["pseudo_labels_in_band"].value > 0
        assert student["pseudo_rows"].value == student["pseudo_labels_in_band"].value
    else:
        assert student["gold_rows"].value == 0 and student["pseudo_rows"].value == student["train_rows"].value > 0


def test_the_gold_and_random_label_controls_refuse_another_mode(sevens_lake_copy, sevens_model_dir) -> None:
    lake = sevens_lake_copy()
    config = tiny_config(sevens_model_dir)
    gold = op(layout.round_prefix(1), layout.control_checkpoint(layout.GOLD_LABEL))
    config = with_op_config(config, gold, mode="sft")
    selection = round_names(1, layout.GENERATIONS, layout.control_checkpoint(layout.GOLD_LABEL))
    result = materialize(lake, selection, config, ARM, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert (
        "trains GRPO with the hard reward on its own labels, no counterpart of mode=sft"
        in failure.event_specific_data.error.message
    )


def test_a_pseudo_only_round_trains_no_labeled_problem_and_every_control_stays_matched(
    sevens_lake_copy, sevens_model_dir
) -> None:
    lake = sevens_lake_copy()
    config = tiny_config(sevens_model_dir)
    grpo = config["ops"][STUDENT_OP]["config"]["grpo"] | {"max_steps": 2}
    prefix = layout.round_prefix(1)
    for control in layout.DEFAULT_CONTROLS:
        config = with_op_config(config, op(prefix, layout.control_checkpoint(control)), grpo=grpo)
    for name in (
        layout.STUDENT,
        layout.control_checkpoint(layout.GOLD_LABEL),
        layout.control_checkpoint(layout.RANDOM_LABEL),
    ):
        config = with_op_config(config, op(prefix, name), grpo=grpo, pseudo_only=True)
    controls = [layout.control_checkpoint(control) for control in layout.DEFAULT_CONTROLS]
    result = materialize(
        lake, round_names(1, layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT, *controls), config, ARM
    )

    trained = {name: metadata_of(result, "/".join(layout.round_asset(1, name))) for name in (layout.STUDENT, *controls)}
    unlabeled = lake.read_table(dg.AssetKey(layout.UNLABELED_PROBLEMS), ARM).height
    labeled = lake.read_table(dg.AssetKey(layout.LABELED_PROBLEMS), ARM).height
    student, gold, random = (trained[name] for name in (layout.STUDENT, controls[1], controls[2]))
    assert student["gold_rows"].value == 0 and student["pseudo_rows"].value == student["train_rows"].value > 0
    assert random["gold_rows"].value == 0 and random["train_rows"].value == student["train_rows"].value
    assert (
        gold["gold_rows"].value == gold["train_rows"].value == unlabeled
    )  # the unlabeled problems alone, with their gold
    assert trained[CONTROL.split("/")[-1]]["gold_rows"].value == labeled  # the labeled-only control as ever
    checks = {(c.asset_key.to_user_string(), c.check_name): c.passed for c in result.get_asset_check_evaluations()}
    for control in controls:
        assert checks[("/".join(layout.round_asset(1, control)), "compute_matched")], control
