"""Paired bootstrap intervals of a round minus its control, over problems and over seeds."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from noisy_student_assets.core.reporting.verdict import paired_difference, paired_scores

NAMES = {"treatment_name": "round 2", "control_name": "its labeled-only control"}


def test_identical_scores_differ_by_exactly_nothing() -> None:
    scores = np.array([[1, 0, 1, 1, 0, 0, 1, 0]])
    difference = paired_difference(scores, scores, **NAMES)
    assert (difference.estimate, difference.low, difference.high) == (0.0, 0.0, 0.0)
    assert difference.outcome == "no difference" and "is not distinguishable from" in difference.sentence()


def test_a_clear_gain_has_an_interval_above_zero_and_says_so() -> None:
    rng = np.random.default_rng(1)
    control = rng.random((1, 300)) < 0.3
    treatment = control | (rng.random((1, 300)) < 0.3)  # right wherever the control is, and more
    difference = paired_difference(treatment, control, **NAMES)
    assert difference.low > 0 and difference.outcome == "better"
    assert difference.low < difference.estimate < difference.high
    assert difference.sentence().startswith(f"round 2 is ahead of its labeled-only control on one seed: +{difference.estimate:.3f}")
    assert "over 300 eval problems; 1 seed, so the interval says nothing about seed-to-seed variation" in difference.sentence()
    assert "beats" not in difference.sentence()
    two_seeds = paired_difference(np.vstack([treatment, treatment]), np.vstack([control, control]), **NAMES)
    assert two_seeds.sentence().startswith("round 2 beats its labeled-only control") and "2 seeds x 300 eval problems" in two_seeds.sentence()
    assert paired_difference(control, treatment, **NAMES).outcome == "worse"


def test_pairing_makes_the_interval_narrower_than_the_accuracies_own_spread() -> None:
    """A treatment that flips a few answers of a control is measured against those few, not against the
    sampling noise of either accuracy."""
    rng = np.random.default_rng(2)
    control = rng.random((1, 400)) < 0.5
    treatment = control.copy()
    treatment[0, :12] = True
    difference = paired_difference(treatment, control, **NAMES)
    unpaired_se = np.sqrt(2 * 0.25 / 400)
    assert difference.high - difference.low < 2 * 1.96 * unpaired_se / 2


def test_seeds_that_disagree_widen_the_interval() -> None:
    """Two seeds, one gaining 20 points and one losing 20: the mean is 0, and an interval over seeds
    must not call it certain, while the problems alone (one seed) would."""
    rng = np.random.default_rng(3)
    control = (rng.random((2, 200)) < 0.4).astype(float)
    treatment = control.copy()
    treatment[0, control[0] == 0] = (rng.random(int((control[0] == 0).sum())) < 0.34)
    treatment[1, control[1] == 1] = (rng.random(int((control[1] == 1).sum())) < 0.5)
    alone = paired_difference(treatment[:1], control[:1], **NAMES)
    pooled = paired_difference(treatment, control, **NAMES)
    assert alone.outcome == "better"
    assert pooled.low < 0 < pooled.high and pooled.seeds == 2
    assert pooled.high - pooled.low > alone.high - alone.low


def test_the_interval_is_reproducible() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.random((3, 50)) < 0.5, rng.random((3, 50)) < 0.5
    assert paired_difference(a, b, **NAMES) == paired_difference(a, b, **NAMES)


def test_score_tables_are_aligned_on_the_problems_all_of_them_scored() -> None:
    def table(ids, correct):
        return pl.DataFrame({"problem_id": ids, "greedy_correct": correct})

    treatment, control = paired_scores([
        (table(["p2", "p1", "p3"], [True, False, True]), table(["p1", "p2"], [True, True])),
        (table(["p1", "p2"], [False, False]), table(["p2", "p1"], [True, False])),
    ])
    assert treatment.tolist() == [[0.0, 1.0], [0.0, 0.0]] and control.tolist() == [[1.0, 1.0], [0.0, 1.0]]
    with pytest.raises(ValueError, match="share no eval problem"):
        paired_scores([(table(["p1"], [True]), table(["p9"], [True]))])
    with pytest.raises(ValueError, match="one equal, non-empty shape"):
        paired_difference(np.ones((1, 3)), np.ones((1, 4)), **NAMES)
