"""What the run summary leads with (no Dagster here): per arm, the teacher labeled RL made (its steps, why it stopped,
its validation and held-out accuracy, its round-1 labels' accuracy against the hidden gold) beside the labeled-only
control's held-out accuracy; then per round, which model taught it and the student against its control.

Everything is read from files a results directory keeps too (`lake_reader.result_files`): the labeled-RL checkpoint's
compute record and training log, the evaluations, the audits and each promotion's decision.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import Arm
from noisy_student_assets.core.lake_reader import ArmLake
from noisy_student_assets.core.promotion import taught_sentence
from noisy_student_assets.core.reporting.markdown import markdown_table
from noisy_student_assets.core.training.validation_stop import best_check, logged_checks


def _greedy(arm_lake: ArmLake, number: int, role: str) -> float | None:
    evaluation = arm_lake.round_evaluation(number, role)
    return evaluation.metrics["greedy_accuracy"] if evaluation else None


def _last_control(arm_lake: ArmLake, max_rounds: int) -> tuple[int | None, float | None]:
    """The last round with a labeled-only control's evaluation, and its held-out greedy accuracy."""
    for number in range(max_rounds, 0, -1):
        accuracy = _greedy(arm_lake, number, layout.LABELED_ONLY)
        if accuracy is not None:
            return number, accuracy
    return None, None


def teacher_row(lake: Path, arm: Arm) -> dict | None:
    """The arm's labeled-RL teacher as the summary's first table shows it; None before labeled RL has trained."""
    arm_lake = ArmLake(lake, arm.name)
    checkpoint = arm_lake.checkpoint(layout.LABELED_RL)
    if checkpoint is None:
        return None
    best = best_check(logged_checks(checkpoint.training_log or []))
    labels = arm_lake.labels(1)
    audit = labels.audit if labels else None
    control_round, control = _last_control(arm_lake, arm.stopping_rule.max_rounds)
    validation, held_out = (
        arm_lake.evaluation(name) for name in (layout.LABELED_RL_VALIDATION, layout.LABELED_RL_EVAL)
    )
    return {
        "arm": arm.name,
        "steps": checkpoint.compute.own.optimizer_steps,
        "stopped": checkpoint.compute.stopped,
        "kept_step": best.step if best else None,
        "best_check": best.accuracy if best else None,
        "validation_greedy": validation.metrics["greedy_accuracy"] if validation else None,
        "held_out_greedy": held_out.metrics["greedy_accuracy"] if held_out else None,
        "labels_kept": f"{audit.kept:.0f} of {audit.kept / audit.coverage:.0f}" if audit and audit.coverage else None,
        "kept_label_accuracy": audit.kept_label_accuracy if audit else None,
        "all_label_accuracy": audit.all_label_accuracy if audit else None,
        "control_round": control_round,
        "control_held_out_greedy": control,
    }


def teaching_rows(lake: Path, arm: Arm) -> list[dict]:
    """Per round with a student evaluated: which model taught it (with its promotion's decision) and the student's
    held-out accuracy against its labeled-only control's."""
    arm_lake, rows = ArmLake(lake, arm.name), []
    for number in range(1, arm.stopping_rule.max_rounds + 1):
        student = _greedy(arm_lake, number, layout.STUDENT_ROLE)
        if student is None:
            break
        control = _greedy(arm_lake, number, layout.LABELED_ONLY)
        rows.append(
            {
                "arm": arm.name,
                "round": number,
                "taught_by": taught_sentence(arm_lake.promotion(number), number),
                "student_held_out": student,
                "control_held_out": control,
                "student_minus_control": student - control if control is not None else None,
            }
        )
    return rows


def teacher_tables(lake: Path, arms: list[Arm]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The summary's teacher table (`teacher_row`) and its table of who taught each round (`teaching_rows`)."""
    teachers = [row for arm in arms if (row := teacher_row(lake, arm)) is not None]
    taught = [row for arm in arms for row in teaching_rows(lake, arm)]
    return pl.DataFrame(teachers, infer_schema_length=None), pl.DataFrame(taught, infer_schema_length=None)


def teacher_markdown(teachers: pl.DataFrame, taught: pl.DataFrame) -> list[str]:
    """The summary's first sections: the teacher table, then who taught each round (`teacher_tables`)."""
    lines = []
    if teachers.height:
        lines += [
            "## The teacher: labeled RL (steps, why it stopped, kept step and its validation check; greedy accuracy on "
            "the validation and held-out problems; its round-1 labels against the hidden gold; the labeled-only "
            "control's held-out accuracy at its last round)",
            "",
            markdown_table(teachers, max_rows=None, max_chars=300),
            "",
        ]
    if taught.height:
        lines += [
            "## Who taught each round, and the student against its labeled-only control (held-out greedy accuracy)",
            "",
            markdown_table(taught, max_rows=None, max_chars=300),
            "",
        ]
    return lines
