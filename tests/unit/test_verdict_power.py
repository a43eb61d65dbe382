"""Every verdict says what it could have detected: the minimum detectable effect (MDE) a verdict prints is the true
effect its own interval finds about 80% of the time, and one a third of it rarely (issue 47, item 1)."""

from __future__ import annotations

import numpy as np
import pytest

from noisy_student_assets.core.reporting.verdict import (
    INCONCLUSIVE,
    PILOT,
    crossed_errors,
    minimum_detectable_effect,
    outcome_of,
    paired_difference,
    wording,
)

NAMES = {"treatment_name": "round 1", "control_name": "its labeled-only control"}
GRIDS = 400
"""Grids per simulated effect: a detection rate of 0.8 has a standard error of 0.02."""
RESAMPLES = 1000
"""The one-seed bootstrap's resamples here (the verdict's own default is 10,000; its 2.5% quantiles hardly move)."""


def _grids(
    rng: np.random.Generator, seeds: int, seed_sd: float, effect: float = 0.0, problems: int = 210
) -> tuple[np.ndarray, np.ndarray]:
    """A treatment and its control scored 0/1 on the same problems, seed by seed: each problem has its own difficulty,
    each seed shifts each checkpoint's accuracy (their difference spreads with sd `seed_sd`), and the treatment is
    `effect` more accurate. Difficulties stay within 0.2 to 0.6 so that no effect here is clipped at 1."""
    difficulty = rng.uniform(0.2, 0.6, problems)
    shift = rng.normal(0, seed_sd / np.sqrt(2), (2, seeds, 1))
    treatment = rng.random((seeds, problems)) < difficulty + effect + shift[0]
    return treatment, rng.random((seeds, problems)) < difficulty + shift[1]


@pytest.mark.parametrize(
    ("seeds", "seed_sd"),
    [(1, 0.0), (3, 0.06), (5, 0.06)],
    ids=["one seed, the bootstrap", "3 seeds, the crossed t-interval", "5 seeds"],
)
def test_the_printed_mde_is_detected_about_80_percent_of_the_time_and_a_third_of_it_rarely(
    seeds: int, seed_sd: float
) -> None:
    """The effect is the printed MDE's root mean square over null grids: on a few seeds each grid's MDE is an estimate
    with few degrees of freedom (one pilot's can be half or twice the typical one). The MDE is anchored to what the
    design allows, too: at most 2.5 times the MDE that a known standard error (the estimates' spread over the grids)
    would give, (1.96 + 0.84) x it; 3 seeds cost about twice that (t quantiles at about 2 degrees of freedom)."""
    rng = np.random.default_rng(seeds)

    def verdicts(effect: float) -> list:
        return [
            paired_difference(*_grids(rng, seeds, seed_sd, effect), **NAMES, n_resamples=RESAMPLES)
            for _ in range(GRIDS)
        ]

    null = verdicts(0.0)
    printed = float(np.sqrt(np.mean([verdict.mde**2 for verdict in null])))
    known_error_mde = minimum_detectable_effect(float(np.std([verdict.estimate for verdict in null])), np.inf)
    assert known_error_mde * 0.8 < printed < known_error_mde * 2.5
    detected = np.mean([verdict.direction == "better" for verdict in verdicts(printed)])
    assert 0.72 <= detected <= 0.88
    assert np.mean([verdict.direction == "better" for verdict in verdicts(printed / 3)]) < 0.25


def test_one_rule_words_every_verdict() -> None:
    assert outcome_of(0.01, 0.2) == "better" and outcome_of(-0.2, -0.01) == "worse"
    assert outcome_of(-0.03, 0.04) == INCONCLUSIVE
    assert outcome_of(-0.03, 0.04, margin=0.05) == "no effect larger than 0.05"
    assert outcome_of(-0.03, 0.06, margin=0.05) == INCONCLUSIVE
    assert wording(INCONCLUSIVE, 0.1234) == "inconclusive: could have missed an effect up to 0.123"
    assert wording("better", 0.1234) == "better"
    assert wording(PILOT, 0.0716) == PILOT  # a pilot's one seed takes no side, so it misses nothing it could claim


def test_a_verdict_that_takes_no_side_is_inconclusive_unless_within_its_margin() -> None:
    rng = np.random.default_rng(5)
    treatment, control = _grids(rng, 3, 0.06)
    unbounded = paired_difference(treatment, control, **NAMES)
    assert unbounded.direction == INCONCLUSIVE
    assert f"could have missed an effect up to {unbounded.mde:.3f}" in unbounded.sentence()
    assert unbounded.mde > unbounded.high - unbounded.estimate  # past the interval's half-width
    bounded = paired_difference(treatment, control, **NAMES, margin=round(unbounded.high - unbounded.low, 2))
    assert bounded.direction.startswith("no effect larger than") and "could have missed" not in bounded.sentence()


def test_fewer_degrees_of_freedom_need_a_larger_effect() -> None:
    """At 2 degrees of freedom the noncentral t needs 5.65 standard errors for 80% power, (4.30 + 1.06) has 77%;
    with a known standard error 1.96 + 0.84."""
    assert minimum_detectable_effect(1.0, 2) == pytest.approx(5.65, abs=0.01)
    assert minimum_detectable_effect(1.0, np.inf) == pytest.approx(1.96 + 0.8416, abs=1e-3)
    assert minimum_detectable_effect(0.5, 10) == pytest.approx(minimum_detectable_effect(1.0, 10) / 2)


def test_an_mde_exists_at_any_degrees_of_freedom() -> None:
    """Below 1 degree of freedom scipy's noncentral t is unreliable (near 0.2 it failed in brentq): the MDE is then
    Bloom's bound, finite and larger than at more degrees of freedom, not an error."""
    tiny = minimum_detectable_effect(1.0, 0.15)
    assert np.isfinite(tiny) and tiny > minimum_detectable_effect(1.0, 0.3) > minimum_detectable_effect(1.0, 1)


@pytest.mark.parametrize("problem_to_residual", [0.5, 1.001], ids=["at the residual's", "just above it"])
def test_problems_that_hardly_vary_beyond_the_residual_keep_the_seeds_degrees_of_freedom(
    problem_to_residual: float,
) -> None:
    """Where the problems' mean square is at the residual's, the problem and residual terms of the crossed variance
    are one estimate that cancels; just above it they nearly cancel. Neither makes Satterthwaite's degrees of freedom
    fall towards 0, in the verdict (3 seeds) or in `grid power`'s projection to 100 seeds (where they fell to 0.13:
    the problem term was kept at the pilot's size while the seeds' shrank)."""
    rng = np.random.default_rng(0)
    differences = (rng.random((3, 210)) < 0.4).astype(float) - (rng.random((3, 210)) < 0.4)
    differences -= differences.mean(axis=0, keepdims=True)  # no problem effect at all
    differences += rng.normal(0, 0.05, (3, 1))
    residual = differences - differences.mean(axis=1, keepdims=True)
    residual_square = (residual**2).sum() / (2 * 209)
    problem_effect = rng.normal(size=210)
    problem_effect -= problem_effect.mean()
    differences += np.sqrt(problem_to_residual * residual_square / (3 * problem_effect.var(ddof=1))) * problem_effect
    for seeds in (3, 100):
        (per_seed, per_seed_dof), (crossed, crossed_dof) = crossed_errors(differences, seeds)
        assert per_seed_dof == seeds - 1 and crossed_dof > (seeds - 1) / 2
        assert crossed >= per_seed
