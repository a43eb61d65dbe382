"""Which model teaches the next round (`core/promotion.py`): the better on validation, a tie to the student, or the
student always; the promoted checkpoint's compute record and decision."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.promotion import (
    PROMOTION_FILE,
    decide,
    first_made,
    read_promotion,
    record,
    taught_sentence,
)
from noisy_student_assets.core.settings import STUDENT_PROMOTION, VALIDATION_PROMOTION

STUDENT_DIR, TEACHER_DIR = Path("/lake/round_001/student_checkpoint/a"), Path("/lake/labeled_rl_checkpoint/a")


@pytest.mark.parametrize(
    ("student", "teacher", "promoted"),
    [(0.5, 0.4, "student"), (0.3, 0.4, "teacher"), (0.4, 0.4, "student")],
)
def test_the_validation_rule_promotes_the_better_model_and_a_tie_to_the_student(student, teacher, promoted) -> None:
    promotion = decide(VALIDATION_PROMOTION, STUDENT_DIR, TEACHER_DIR, student, teacher)
    assert promotion.promoted == promoted
    assert promotion.checkpoint == (STUDENT_DIR if promoted == "student" else TEACHER_DIR)
    assert promotion.validation == max(student, teacher)
    assert promotion.margin == pytest.approx(student - teacher)


def test_a_student_worse_than_its_teacher_still_teaches_under_the_student_rule() -> None:
    promotion = decide(STUDENT_PROMOTION, STUDENT_DIR, TEACHER_DIR, 0.2, 0.6)
    assert (promotion.promoted, promotion.checkpoint, promotion.validation) == ("student", STUDENT_DIR, 0.2)
    assert promotion.margin == pytest.approx(-0.4), "the scores are recorded all the same"
    assert decide(STUDENT_PROMOTION, STUDENT_DIR, TEACHER_DIR, None, None).margin is None, "and need not exist"


@pytest.mark.parametrize(("student", "teacher", "named"), [(None, 0.4, "student"), (0.4, None, "teacher")])
def test_the_validation_rule_refuses_a_model_without_a_validation_score(student, teacher, named) -> None:
    with pytest.raises(ValueError, match=f"none for the {named}$"):
        decide(VALIDATION_PROMOTION, STUDENT_DIR, TEACHER_DIR, student, teacher)


def _checkpoint(directory: Path, weights: str, optimizer_steps: int) -> Path:
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_text(weights)
    (directory / layout.COMPUTE_FILE).write_text(json.dumps({"total": {"optimizer_steps": optimizer_steps}}))
    return directory


def test_a_promoted_teacher_carries_its_weights_the_student_s_compute_and_the_decision(tmp_path: Path) -> None:
    teacher = _checkpoint(tmp_path / "teacher", "teacher weights", 6)
    student = _checkpoint(tmp_path / "student", "student weights", 12)
    promotion = decide(VALIDATION_PROMOTION, student, teacher, 0.25, 0.5)
    staged = tmp_path / "staged"
    shutil.copytree(promotion.checkpoint, staged, copy_function=os.link)  # as the lake stages a copy

    record(promotion, staged)

    assert (staged / "model.safetensors").read_text() == "teacher weights"
    assert json.loads((staged / layout.COMPUTE_FILE).read_text())["total"]["optimizer_steps"] == 12, (
        "the student was trained either way: the next round's student is matched with a control that trained too"
    )
    assert json.loads((teacher / layout.COMPUTE_FILE).read_text())["total"]["optimizer_steps"] == 6, (
        "the teacher's own record, a hard link of the copy's, is left as it was"
    )
    assert read_promotion(staged) == promotion
    assert read_promotion(teacher) is None, "labeled RL was made by no promotion"


def test_a_decision_file_that_is_not_a_promotion_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / PROMOTION_FILE).write_text(json.dumps({"promoted": "student"}))
    with pytest.raises(ValueError, match=PROMOTION_FILE):
        read_promotion(tmp_path)


def test_a_teacher_kept_twice_is_a_copy_of_the_checkpoint_first_made(tmp_path: Path) -> None:
    """Round 3's teacher kept round 2's, itself labeled RL kept: its flips count from labeled RL's evaluation."""
    labeled_rl = _checkpoint(tmp_path / "labeled_rl_checkpoint" / "a", "teacher weights", 6)
    students = [_checkpoint(tmp_path / f"round_00{n}" / "student_checkpoint" / "a", "weights", 12) for n in (1, 2)]
    teacher = labeled_rl
    for number, student in enumerate(students, start=2):
        promotion = decide(VALIDATION_PROMOTION, student, teacher, 0.1, 0.5)
        teacher = tmp_path / f"round_00{number}" / "teacher" / "a"
        shutil.copytree(promotion.checkpoint, teacher, copy_function=os.link)
        record(promotion, teacher)
    assert read_promotion(teacher).checkpoint == tmp_path / "round_002" / "teacher" / "a"
    assert first_made(teacher) == labeled_rl and first_made(students[0]) == students[0]


@pytest.mark.parametrize(
    ("rule", "student", "teacher", "words"),
    [
        (
            VALIDATION_PROMOTION,
            0.5,
            0.4,
            "Round 2 is taught by round 1's student, promoted over its teacher: the "
            "student scored 0.500 on the validation problems, its teacher 0.400 (+0.100).",
        ),
        (
            VALIDATION_PROMOTION,
            0.3,
            0.4,
            "Round 2 is taught by round 1's teacher again, kept over its student: the "
            "student scored 0.300 on the validation problems, its teacher 0.400 (-0.100).",
        ),
        (
            STUDENT_PROMOTION,
            None,
            None,
            "Round 2 is taught by round 1's student, as the `student` rule always has "
            "it: neither was scored on the validation problems.",
        ),
    ],
)
def test_a_decision_says_which_model_teaches_and_by_how_much(rule, student, teacher, words) -> None:
    assert decide(rule, STUDENT_DIR, TEACHER_DIR, student, teacher).sentence(2) == words


def test_without_a_decision_round_one_is_taught_by_labeled_rl_and_a_later_round_by_the_student_before_it() -> None:
    assert taught_sentence(None, 1) == "Round 1 is taught by labeled RL."
    assert taught_sentence(None, 3) == "Round 3 is taught by round 2's student (no promotion recorded)."
