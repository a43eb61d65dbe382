"""Paired intervals of a round minus its control, over problems and over seeds, and how often they are wrong."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from noisy_student_assets.core.reporting.verdict import (
    INCONCLUSIVE,
    PILOT,
    outcome_of,
    paired_difference,
    paired_scores,
    seeds_interval,
)

NAMES = {"treatment_name": "round 2", "control_name": "its labeled-only control"}


def test_identical_scores_differ_by_exactly_nothing() -> None:
    scores = np.array([[1, 0, 1, 1, 0, 0, 1, 0]])
    difference = paired_difference(scores, scores, **NAMES)
    assert (difference.estimate, difference.low, difference.high) == (0.0, 0.0, 0.0)
    assert difference.outcome == PILOT and "One seed: no verdict" in difference.sentence()


def test_a_clear_gain_is_a_pilot_on_one_seed_and_a_verdict_over_seeds() -> None:
    rng = np.random.default_rng(1)
    control = rng.random((1, 300)) < 0.3
    treatment = control | (rng.random((1, 300)) < 0.3)  # right wherever the control is, and more
    difference = paired_difference(treatment, control, **NAMES)
    assert difference.low > 0 and difference.outcome == PILOT  # the interval over problems alone takes no side
    assert difference.low < difference.estimate < difference.high
    assert difference.sentence().startswith(
        f"round 2 minus its labeled-only control, one seed: +{difference.estimate:.3f} greedy accuracy"
    )
    assert "over 300 eval problems alone" in difference.sentence()
    assert "One seed: no verdict; `grid power` plans the seeds a verdict needs once 3 seeds have run" in (
        difference.sentence()
    )
    assert not any(word in difference.sentence() for word in ("beats", "ahead", "better"))
    two_seeds = paired_difference(np.vstack([treatment, treatment]), np.vstack([control, control]), **NAMES)
    assert (
        two_seeds.sentence().startswith("round 2 beats its labeled-only control")
        and "2 seeds x 300 eval problems" in two_seeds.sentence()
    )
    assert two_seeds.outcome == "better"
    assert paired_difference(control, treatment, **NAMES).outcome == PILOT


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
    treatment[0, control[0] == 0] = rng.random(int((control[0] == 0).sum())) < 0.34
    treatment[1, control[1] == 1] = rng.random(int((control[1] == 1).sum())) < 0.5
    alone = paired_difference(treatment[:1], control[:1], **NAMES)
    pooled = paired_difference(treatment, control, **NAMES)
    assert alone.low > 0 and alone.outcome == PILOT
    assert pooled.low < 0 < pooled.high and pooled.seeds == 2
    assert pooled.high - pooled.low > alone.high - alone.low


def test_the_interval_is_reproducible() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.random((3, 50)) < 0.5, rng.random((3, 50)) < 0.5
    assert paired_difference(a, b, **NAMES) == paired_difference(a, b, **NAMES)


def test_score_tables_are_aligned_on_the_problems_all_of_them_scored() -> None:
    def table(ids, correct):
        return pl.DataFrame({"problem_id": ids, "greedy_correct": correct})

    treatment, control = paired_scores(
        [
            (table(["p2", "p1", "p3"], [True, False, True]), table(["p1", "p2"], [True, True])),
            (table(["p1", "p2"], [False, False]), table(["p2", "p1"], [True, False])),
        ]
    )
    assert treatment.tolist() == [[0.0, 1.0], [0.0, 0.0]] and control.tolist() == [[1.0, 1.0], [0.0, 1.0]]
    with pytest.raises(ValueError, match="share no eval problem"):
        paired_scores([(table(["p1"], [True]), table(["p9"], [True]))])
    with pytest.raises(ValueError, match="one equal, non-empty shape"):
        paired_difference(np.ones((1, 3)), np.ones((1, 4)), **NAMES)


def _null_grids(
    rng: np.random.Generator, seeds: int, effect: float = 0.0, problems: int = 210
) -> tuple[np.ndarray, np.ndarray]:
    """A student and its control scored on the same problems, seed by seed, like the project's grids: each problem
    has its own difficulty; each seed moves each checkpoint's accuracy (the seeds' differences spread with sd 0.06,
    pool-mixed round 2 was -0.100, +0.076 and +0.029); and the two checkpoints, trained from one teacher, answer
    most problems alike (80% of their draws shared)."""
    difficulty = rng.uniform(0.1, 0.9, problems)
    seed_shift = rng.normal(0, 0.06 / np.sqrt(2), (2, seeds, 1))
    draw = rng.random((seeds, problems))
    other = np.where(rng.random((seeds, problems)) < 0.8, draw, rng.random((seeds, problems)))
    return draw < np.clip(difficulty + effect + seed_shift[0], 0, 1), other < np.clip(difficulty + seed_shift[1], 0, 1)


def _pooled_percentile_bootstrap_excludes_zero(
    treatment: np.ndarray, control: np.ndarray, rng: np.random.Generator
) -> bool:
    """The interval this project used before: seeds and problems resampled together, percentile bounds."""
    differences = treatment.astype(float) - control
    n_seeds, n_problems = differences.shape
    by_seed = np.stack([row[rng.integers(0, n_problems, size=(1000, n_problems))].mean(axis=1) for row in differences])
    replicates = np.take_along_axis(by_seed, rng.integers(0, n_seeds, size=(n_seeds, 1000)), axis=0).mean(axis=0)
    low, high = np.quantile(replicates, [0.025, 0.975])
    return bool(low > 0 or high < 0)


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_with_no_true_effect_the_verdict_takes_a_side_about_5_percent_of_the_time(seeds: int) -> None:
    rng = np.random.default_rng(seeds)
    sided = [paired_difference(*_null_grids(rng, seeds), **NAMES).direction != INCONCLUSIVE for _ in range(1500)]
    assert np.mean(sided) <= 0.07  # nominal 0.05; 1500 trials have a standard error of 0.006


def test_the_simulation_catches_the_pooled_bootstrap_it_replaced() -> None:
    """The same simulation fails the interval the verdict used before (seeds resampled as if they were many): at 3
    seeds it takes a side in about 12% of null grids, so the test above can fail."""
    rng = np.random.default_rng(0)
    sided = [_pooled_percentile_bootstrap_excludes_zero(*_null_grids(rng, 3), rng) for _ in range(800)]
    assert np.mean(sided) > 0.08


def test_a_real_gain_still_comes_out_on_five_seeds() -> None:
    """Wider is not always safer: a 15-point gain, as large as labeled RL's own from 8 to 16 steps, is called on 5
    seeds in most grids."""
    rng = np.random.default_rng(7)
    called = [paired_difference(*_null_grids(rng, 5, effect=0.15), **NAMES).direction == "better" for _ in range(300)]
    assert np.mean(called) > 0.8


def test_a_few_seeds_that_agree_closely_still_have_the_problems_width() -> None:
    """Three seeds with the same per-seed difference: the seeds' spread is 0, and the problems' own sampling
    keeps the interval open (the crossed variance, not the seed means' alone)."""
    rng = np.random.default_rng(8)
    control = (rng.random((1, 200)) < 0.5).astype(float)
    treatment = control.copy()
    treatment[0, :20] = 1 - treatment[0, :20]
    pooled = paired_difference(np.repeat(treatment, 3, axis=0), np.repeat(control, 3, axis=0), **NAMES)
    assert pooled.seeds == 3 and pooled.high - pooled.low > 0.02


def test_seeds_whose_means_tie_on_different_problems_still_have_an_interval() -> None:
    """Three seeds each gain a net 4 of 210 problems, each on problems of its own: the seed means tie (their spread
    is 0) and the problems' mean square can fall below the residual's; the residual still gives the interval width."""
    control = np.zeros((3, 210))
    treatment = control.copy()
    for seed in range(3):
        treatment[seed, seed * 60 : seed * 60 + 10] = 1
        control[seed, seed * 60 + 10 : seed * 60 + 16] = 1
    pooled = paired_difference(treatment, control, **NAMES)
    assert pooled.estimate == pytest.approx(4 / 210)
    assert pooled.low < pooled.estimate < pooled.high and pooled.high - pooled.low > 0.01


def test_seeds_that_agree_by_chance_keep_the_width_their_own_sampling_gives() -> None:
    """Three seeds with the same difference: the seeds' spread is 0, the interval is each seed's sampling variance's
    (normal); seeds that disagree more than their sampling allows get the t-interval over seeds."""
    low, high, _ = seeds_interval(np.array([0.1, 0.1, 0.1]), np.array([0.01, 0.01, 0.01]))
    assert (low, high) == (
        pytest.approx(0.1 - 1.96 * np.sqrt(0.03) / 3, abs=1e-3),
        pytest.approx(0.1 + 1.96 * np.sqrt(0.03) / 3, abs=1e-3),
    )
    spread = np.array([-0.2, 0.1, 0.4])
    low, high, _ = seeds_interval(spread, np.full(3, 1e-6))
    assert high - low == pytest.approx(2 * 4.303 * 0.3 / np.sqrt(3), abs=1e-3)


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_with_no_true_difference_a_label_source_takes_a_side_at_most_5_percent_of_the_time(seeds: int) -> None:
    """The direct effect's interval (`summary.sources_against`): one source's kept-label accuracy minus another's over
    16 labels per seed, two sources judging the same samples as the null grids' two checkpoints do. The t-interval
    over the seeds alone takes a side in about 11% of these at 2 seeds (a few labels make differences that coincide
    by chance, and a zero-width interval); with each seed's binomial width as its floor, at most 5%."""
    rng = np.random.default_rng(seeds)
    floored, seeds_alone = [], []
    for _ in range(2000):
        source, majority = (labels.mean(axis=1) for labels in _null_grids(rng, seeds, problems=16))
        differences = source - majority
        floored.append(
            outcome_of(*seeds_interval(differences, (source * (1 - source) + majority * (1 - majority)) / 16)[:2])
            != INCONCLUSIVE
        )
        seeds_alone.append(outcome_of(*seeds_interval(differences, np.zeros(seeds))[:2]) != INCONCLUSIVE)
    assert np.mean(floored) <= 0.05
    if seeds == 2:
        assert np.mean(seeds_alone) > 0.08, "the simulation catches the seeds-only interval"
