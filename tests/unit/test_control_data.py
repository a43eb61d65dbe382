"""The controls' training data, built from hand-made labels."""

from __future__ import annotations

import polars as pl
import pytest

from noisy_student_assets.core.grading import answers_equivalent
from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN
from noisy_student_assets.core.pseudo_labels.control_data import (
    dosed_gold_labels,
    gold_revealed,
    kept_gold_labels,
    shuffled_pseudo_labels,
)

KEPT = pl.DataFrame(
    {
        "problem_id": [f"p{i}" for i in range(6)],
        "prompt": [f"What is {i} + 1?" for i in range(6)],
        "pseudo_label": ["1", "2", "3", "4", "5", "6"],
        "agreement": [1.0] * 6,
        HIDDEN_GOLD_COLUMN: ["99"] * 6,
    }
)


def test_shuffled_labels_are_a_permutation_that_moves_every_label() -> None:
    shuffled = shuffled_pseudo_labels(KEPT, seed=0)
    assert shuffled.columns == ["problem_id", "prompt", "pseudo_label"]  # the hidden gold is not carried
    assert shuffled["problem_id"].to_list() == KEPT["problem_id"].to_list()
    assert sorted(shuffled["pseudo_label"]) == sorted(KEPT["pseudo_label"])
    assert (shuffled["pseudo_label"] != KEPT["pseudo_label"]).all()
    assert shuffled.equals(shuffled_pseudo_labels(KEPT, seed=0))
    assert not shuffled.equals(shuffled_pseudo_labels(KEPT, seed=1))


def test_the_shuffle_cannot_read_the_hidden_gold() -> None:
    poisoned = KEPT.with_columns(pl.lit("7").alias(HIDDEN_GOLD_COLUMN))
    assert shuffled_pseudo_labels(poisoned, seed=0).equals(shuffled_pseudo_labels(KEPT, seed=0))


def test_one_or_no_kept_label_is_left_as_it_is() -> None:
    assert shuffled_pseudo_labels(KEPT.head(1), seed=0)["pseudo_label"].to_list() == ["1"]
    assert shuffled_pseudo_labels(KEPT.head(0), seed=0).height == 0


def test_gold_revealed_is_the_hidden_gold_as_labels() -> None:
    revealed = gold_revealed(KEPT.select("problem_id", "prompt", HIDDEN_GOLD_COLUMN))
    assert revealed.columns == ["problem_id", "prompt", "gold_answer"] and set(revealed["gold_answer"]) == {"99"}


UNLABELED = pl.DataFrame(
    {
        "problem_id": [f"u{i}" for i in range(20)],
        "prompt": [f"What is {i} + 10?" for i in range(20)],
        HIDDEN_GOLD_COLUMN: [str(i + 10) for i in range(20)],
    }
)
MAJORITY = pl.DataFrame(  # the teacher's vote: right on even problems, wrong (off by one) on odd ones, none on u19
    {
        "problem_id": UNLABELED["problem_id"],
        "pseudo_label": [str(i + 10 + (i % 2)) if i < 19 else None for i in range(20)],
    }
)


@pytest.mark.parametrize("rho", [0.0, 0.25, 0.5, 1.0])
def test_dosed_gold_labels_are_right_at_one_minus_rho_and_wrong_where_replaced(rho: float) -> None:
    dosed = dosed_gold_labels(UNLABELED, MAJORITY, rho, seed=3, equivalent=answers_equivalent)
    right = [
        bool(answers_equivalent(g, label))
        for g, label in zip(UNLABELED[HIDDEN_GOLD_COLUMN], dosed["gold_answer"], strict=True)
    ]
    assert dosed["problem_id"].to_list() == UNLABELED["problem_id"].to_list()
    assert sum(right) == 20 - round(rho * 20)
    assert [not r for r in right] == dosed["replaced"].to_list()


def test_a_replaced_label_is_the_teacher_s_wrong_majority_where_it_has_one_else_another_problem_s_gold() -> None:
    dosed = dosed_gold_labels(UNLABELED, MAJORITY, 1.0, seed=0, equivalent=lambda a, b: a == b)
    teacher = dict(MAJORITY.iter_rows())
    for problem_id, label in dosed.select("problem_id", "gold_answer").iter_rows():
        index = int(problem_id[1:])
        if index % 2 and index < 19:
            assert label == teacher[problem_id]  # the teacher's own error
        else:  # its majority is right (or absent): another problem's true answer
            assert label != str(index + 10) and label in set(UNLABELED[HIDDEN_GOLD_COLUMN])


def test_the_dose_is_drawn_by_the_seed() -> None:
    first, again, other = (
        dosed_gold_labels(UNLABELED, MAJORITY, 0.5, seed=s, equivalent=lambda a, b: a == b)["replaced"]
        for s in (0, 0, 1)
    )
    assert first.equals(again) and not first.equals(other)


def test_a_problem_with_no_wrong_answer_to_give_is_refused() -> None:
    same = UNLABELED.with_columns(pl.lit("5").alias(HIDDEN_GOLD_COLUMN))
    with pytest.raises(ValueError, match="no wrong answer"):
        dosed_gold_labels(same, MAJORITY.with_columns(pl.lit("5").alias("pseudo_label")), 0.1, 0, lambda a, b: a == b)


def test_kept_gold_labels_are_exactly_the_kept_problems_with_their_true_answers() -> None:
    kept = MAJORITY.filter(pl.col("problem_id").is_in(["u2", "u5", "u11"]))
    labels = kept_gold_labels(UNLABELED, kept)
    assert labels.columns == ["problem_id", "prompt", "gold_answer"]
    assert dict(labels.select("problem_id", "gold_answer").iter_rows()) == {"u2": "12", "u5": "15", "u11": "21"}
