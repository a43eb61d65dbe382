"""Round N's teacher from round 2 on (`round_00N/teacher`): round N-1's student or round N-1's teacher, whichever the
arm's promotion rule picks (`core/promotion.py`), so the lineage draws which checkpoint taught which round.

It reads both checkpoints and, for the validation rule, both validation accuracies: the student's
`student_validation` and, for round 2, labeled RL's `labeled_rl_validation`; a later round's teacher carries its own
in its decision file. The promoted checkpoint is published as hard links to the chosen one's files.
"""

from pathlib import Path

import dagster as dg

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.progress import AskedFor
from noisy_student_assets.core.promotion import decide, read_promotion, record
from noisy_student_assets.core.reporting.eval_report import PublishedEval
from noisy_student_assets.defs.assets.rounds import checkpoint_input, eval_input
from noisy_student_assets.defs.assets.stages import stage
from noisy_student_assets.defs.config import PromotionConfig
from noisy_student_assets.defs.partitions import ARMS, ASKED_FOR, round_group, round_key, teacher_key
from resources.data_lake import CONTENT_KEY_FILE
from resources.stage_resources import StageResources


def teacher_asset(number: int, asked_for: AskedFor = ASKED_FOR) -> dg.AssetsDefinition:
    """Round `number`'s (from 2) promoted teacher; the validation evals it reads where `asked_for` says some arm runs
    them."""
    if number < 2:
        raise ValueError(f"round 1's teacher is labeled RL, promoted from nothing; got round {number}")
    validations = {}
    if asked_for.round_validation:
        validations["student_validation"] = eval_input(round_key(number - 1, layout.STUDENT_VALIDATION))
    if number == 2 and asked_for.labeled_rl_validation:
        validations["teacher_validation"] = eval_input(layout.LABELED_RL_VALIDATION)

    @dg.asset(
        key=teacher_key(number),
        group_name=round_group(number),
        partitions_def=ARMS,
        io_manager_key="checkpoint_io_manager",
        ins={
            "student": checkpoint_input(round_key(number - 1, layout.STUDENT)),
            "teacher": checkpoint_input(teacher_key(number - 1)),
            **validations,
        },
        description=f"Round {number}'s teacher: round {number - 1}'s student, or its teacher where the arm's "
        "promotion rule is `validation` and the student scored lower on the validation problems (hard links to the "
        "chosen checkpoint, with the decision in promotion.json).",
    )
    def teacher(
        context: dg.AssetExecutionContext,
        config: PromotionConfig,
        student: Path,
        teacher: Path,
        stage_resources: StageResources,
        **validation: PublishedEval | None,
    ) -> dg.Output[Path]:
        with stage(context, config, stage_resources) as current:
            promotion = decide(
                current.settings.rule,
                student,
                teacher,
                _accuracy(validation.get("student_validation")),
                _teacher_accuracy(teacher, validation.get("teacher_validation")),
            )
            staged = current.lake.stage_copy(promotion.checkpoint)
            (staged / CONTENT_KEY_FILE).unlink(missing_ok=True)  # not a run of its own: nothing to reuse it for
            record(promotion, staged)
            context.log.info(
                f"round {number}'s teacher: round {number - 1}'s {promotion.promoted} ({promotion.rule} rule; "
                f"validation: student {promotion.student_validation}, teacher {promotion.teacher_validation})"
            )
            current.metadata |= {
                "promoted": promotion.promoted,
                "rule": promotion.rule,
                "student_validation_accuracy": promotion.student_validation,
                "teacher_validation_accuracy": promotion.teacher_validation,
                "margin": promotion.margin,
                "promoted_checkpoint": dg.MetadataValue.path(str(promotion.checkpoint)),
            }
        return current.output(staged)

    return teacher


def _accuracy(evaluation: PublishedEval | None) -> float | None:
    return evaluation.metrics["greedy_accuracy"] if evaluation is not None else None


def _teacher_accuracy(teacher: Path, labeled_rl_validation: PublishedEval | None) -> float | None:
    """The teacher's validation accuracy: a promoted teacher's, from its decision; labeled RL's, from its eval."""
    promoted = read_promotion(teacher)
    return promoted.validation if promoted is not None else _accuracy(labeled_rl_validation)
