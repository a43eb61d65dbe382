"""Which model teaches the next round (no Dagster here): round N's student or round N's teacher, by their greedy
accuracy on the arm's validation problems (never the held-out set), as the `validation` rule asks; the `student` rule
keeps the student teaching whatever it scores.

As in Noisy Student, the student replaces its teacher unless it is worse: a tie promotes the student, which has also
learned from the pseudo-labeled problems. The promoted checkpoint is a copy of the chosen one's files (hard links, in
the lake) with the decision beside it (`promotion.json`), and it carries the student's compute record whichever
model is promoted: the student was trained either way, so the next round's student and its labeled-only control,
whose chain holds every round's training, are still matched on the compute they spent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from noisy_student_assets.core import layout
from noisy_student_assets.core.settings import STUDENT_PROMOTION, VALIDATION_PROMOTION, PromotionRule

PROMOTION_FILE = "promotion.json"
STUDENT, TEACHER = "student", "teacher"
Promoted = Literal["student", "teacher"]


class Promotion(BaseModel):
    """One round's decision (`promotion.json`): the rule, both checkpoints, both validation accuracies (None where the
    rule read none) and which one teaches the next round."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rule: PromotionRule
    promoted: Promoted
    student: str
    teacher: str
    student_validation: float | None
    teacher_validation: float | None

    @property
    def checkpoint(self) -> Path:
        """The promoted checkpoint's directory."""
        return Path(self.student if self.promoted == STUDENT else self.teacher)

    @property
    def validation(self) -> float | None:
        """The promoted model's validation accuracy: the next round's teacher's."""
        return self.student_validation if self.promoted == STUDENT else self.teacher_validation

    @property
    def margin(self) -> float | None:
        """The student's validation accuracy minus its teacher's."""
        if self.student_validation is None or self.teacher_validation is None:
            return None
        return self.student_validation - self.teacher_validation

    def sentence(self, number: int) -> str:
        """Which model teaches round `number` (this decision's round plus one) and by how much, in words."""
        previous = number - 1
        scores = (
            f"the student scored {self.student_validation:.3f} on the validation problems, its teacher "
            f"{self.teacher_validation:.3f} ({self.margin:+.3f})"
            if self.margin is not None
            else "neither was scored on the validation problems"
        )
        if self.rule == STUDENT_PROMOTION:
            why = "student, as the `student` rule always has it"
        elif self.promoted == STUDENT:
            why = "student, promoted over its teacher"
        else:
            why = "teacher again, kept over its student"
        return f"Round {number} is taught by round {previous}'s {why}: {scores}."


def decide(
    rule: PromotionRule,
    student: Path,
    teacher: Path,
    student_validation: float | None,
    teacher_validation: float | None,
) -> Promotion:
    """Round N+1's teacher under `rule`, from round N's student and teacher and their validation accuracies."""
    if rule == VALIDATION_PROMOTION:
        missing = [
            name for name, score in ((STUDENT, student_validation), (TEACHER, teacher_validation)) if score is None
        ]
        if missing:
            absent = " and the ".join(missing)
            raise ValueError(
                f"the validation rule compares both models on the validation problems: none for the {absent}"
            )
        promoted = STUDENT if student_validation >= teacher_validation else TEACHER
    elif rule == STUDENT_PROMOTION:
        promoted = STUDENT
    else:
        raise ValueError(f"unknown promotion rule {rule!r}")
    return Promotion(
        rule=rule,
        promoted=promoted,
        student=str(student),
        teacher=str(teacher),
        student_validation=student_validation,
        teacher_validation=teacher_validation,
    )


def record(promotion: Promotion, staged: Path) -> None:
    """Finish `staged`, a copy of the promoted checkpoint's files: the student's compute record and the decision."""
    compute = staged / layout.COMPUTE_FILE
    compute.unlink(missing_ok=True)  # a new file: the copy's may be a hard link to the teacher's record
    student_compute = Path(promotion.student) / layout.COMPUTE_FILE
    if student_compute.exists():
        compute.write_text(student_compute.read_text())
    decision = staged / PROMOTION_FILE
    decision.unlink(missing_ok=True)  # a kept teacher's copy links its own promotion's decision
    decision.write_text(promotion.model_dump_json(indent=2))


def taught_sentence(promotion: Promotion | None, number: int) -> str:
    """Which model teaches round `number`, in words: labeled RL in round 1; a later round's teacher by its decision,
    or as a lake made before promotions has it (no decision: round `number` - 1's student)."""
    if promotion is not None:
        return promotion.sentence(number)
    if number == 1:
        return "Round 1 is taught by labeled RL."
    return f"Round {number} is taught by round {number - 1}'s student (no promotion recorded)."


def read_promotion(checkpoint: Path) -> Promotion | None:
    """The decision that made a promoted checkpoint, or None for a checkpoint no promotion made (labeled RL's)."""
    path = checkpoint / PROMOTION_FILE
    return layout.read_sidecar(Promotion, path) if path.exists() else None


def first_made(checkpoint: Path) -> Path:
    """The checkpoint a promoted one is a copy of, through any number of promotions: a round's student or labeled RL
    (a checkpoint no promotion made is its own)."""
    promotion = read_promotion(checkpoint)
    return checkpoint if promotion is None else first_made(promotion.checkpoint)
