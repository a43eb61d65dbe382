"""The controls' training data, built from hand-made labels."""

from __future__ import annotations

import polars as pl

from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN
from noisy_student_assets.core.pseudo_labels.control_data import gold_revealed, shuffled_pseudo_labels

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
