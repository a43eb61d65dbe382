"""Does a round beat its compute-matched control? Paired intervals that hold over seeds and problems (no Dagster here).

Both checkpoints are scored on the same eval problems, so the difference is paired by problem.

- One seed: a percentile bootstrap over problems (Efron & Tibshirani 1993; Koehn 2004, the paired bootstrap). It
  says nothing about seed-to-seed variation, so a one-seed comparison is a pilot: its outcome is `PILOT` and its
  sentence says so, never better or worse.
- Several seeds: seeds and problems are crossed factors (every seed is scored on every problem), so the variance of
  the mean difference is that of a two-way random-effects design without replication (Cornfield & Tukey 1956;
  Owen 2007, "The pigeonhole bootstrap"): (MS_seed + MS_problem - MS_residual) / (seeds x problems), from the
  two-way ANOVA mean squares (each factor's at least the residual's), with Satterthwaite's degrees of freedom
  (Satterthwaite 1946), and a Student t interval. It is never narrower than the t-interval over the per-seed mean
  differences (seeds - 1 degrees of freedom), which it becomes when the seeds' spread dominates. The pooled
  percentile bootstrap it replaced resampled three seeds as if they were many: its replicate that draws one seed
  three times has probability 1/27, more than the 2.5% tail, so its interval was about the range of the seeds, and
  with no true effect it said "better" or "worse" in 12% of 3-seed grids against a nominal 5%
  (tests/unit/test_verdict.py simulates it).

Every verdict says what it could have detected: the minimum detectable effect (MDE), the smallest true difference its
two-sided test at the interval's confidence finds with 80% power, (t_{1-alpha/2} + t_{power}) x its standard error at
its degrees of freedom (Bloom 1995, "Minimum detectable effects"; normal quantiles for the bootstrap). One rule words
every verdict (`outcome_of`): an interval that excludes 0 is better or worse; one within +-m of 0, for the margin m
that the experiment file names before the run (`equivalence_margin`), is no effect larger than m; any other is
inconclusive, and could have missed an effect up to its MDE. An interval that takes no side is never read as "none".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from typing import NamedTuple

import numpy as np
import polars as pl

N_RESAMPLES = 10_000
CONFIDENCE = 0.95
POWER = 0.8
INCONCLUSIVE = "inconclusive"
PILOT = "pilot, one seed: no verdict"
"""The outcome of every one-seed comparison, whatever its interval over problems says: at a seed-to-seed spread like
the passes regime's, an interval over problems alone takes a side in most null grids."""
PILOT_SEEDS = 3
"""The fewest seeds whose spread is worth projecting: at 2 the per-seed means' MDE is 16 of their standard errors
(1 degree of freedom), at 3 it is 5.7 (`minimum_detectable_effect`)."""


@dataclass(frozen=True)
class Difference:
    """Mean accuracy of a treatment minus its control, with its interval (`paired_difference`)."""

    treatment: str
    control: str
    estimate: float
    low: float
    high: float
    seeds: int
    problems: int
    mde: float
    """The smallest true difference this interval detects with 80% power (`minimum_detectable_effect`)."""
    margin: float | None = None
    """The experiment's equivalence margin, named before the run (None: none)."""
    confidence: float = CONFIDENCE

    @property
    def direction(self) -> str:
        """The verdict on the interval, by the one rule (`outcome_of`)."""
        return outcome_of(self.low, self.high, self.margin)

    @property
    def outcome(self) -> str:
        """The direction (`outcome_of`) over several seeds; on one seed a pilot's (`PILOT`), never better or worse."""
        return PILOT if self.seeds == 1 else self.direction

    def sentence(self) -> str:
        """The result in one plain sentence. On one seed it is a pilot's estimate: its interval is over eval problems
        alone and says nothing about seed-to-seed variation, so it takes no side."""
        interval = f"{self.confidence:.0%} CI {self.low:+.3f} to {self.high:+.3f}"
        if self.seeds == 1:
            return (
                f"{self.treatment} minus {self.control}, one seed: {self.estimate:+.3f} greedy accuracy ({interval} "
                f"over {self.problems} eval problems alone; MDE {self.mde:.3f} at 80% power). One seed: no verdict; "
                f"`grid power` plans the seeds a verdict needs once {PILOT_SEEDS} seeds have run."
            )
        reading = {
            "better": f"{self.treatment} beats {self.control}",
            "worse": f"{self.treatment} loses to {self.control}",
        }.get(self.direction, f"{self.treatment} is not distinguishable from {self.control}")
        if self.direction not in ("better", "worse"):
            reading += f" ({wording(self.direction, self.mde)})"
        detail = f"{interval}; {self.seeds} seeds x {self.problems} eval problems, t-interval over seeds and problems"
        return f"{reading}: {self.estimate:+.3f} greedy accuracy ({detail}; MDE {self.mde:.3f} at 80% power)."

    def as_dict(self) -> dict:
        return asdict(self) | {"outcome": self.outcome}


def outcome_of(low: float, high: float, margin: float | None = None) -> str:
    """The one rule that words every verdict, on the interval from `low` to `high`: 'better' or 'worse' where it
    excludes 0; 'no effect larger than m' where it lies within +-`margin` (m, named in the experiment file before the
    run); otherwise 'inconclusive' (`wording` adds what it could have missed)."""
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    if margin is not None and -margin <= low and high <= margin:
        return f"no effect larger than {margin:g}"
    return INCONCLUSIVE


def wording(outcome: str, mde: float) -> str:
    """An outcome in words: an inconclusive one says the effect it could have missed (`mde`)."""
    if outcome != INCONCLUSIVE:
        return outcome
    return f"{INCONCLUSIVE}: could have missed an effect up to {mde:.3f}"


def minimum_detectable_effect(standard_error: float, dof: float, confidence: float = CONFIDENCE) -> float:
    """The smallest true difference that the interval at `confidence` excludes 0 on its side of (better for a gain)
    with probability `POWER`, for an estimate of `standard_error` at `dof` degrees of freedom (inf: normal): the
    noncentrality at which the test statistic (noncentral t) passes the interval's critical value with that
    probability, times the standard error. At a few degrees of freedom it exceeds (t_{1-alpha/2} + t_{power}) x the
    standard error (Bloom 1995), whose power at 2 is 77%."""
    from scipy import optimize, stats  # here, not at the top: every Dagster step process imports this module

    critical = stats.t.ppf(1 - (1 - confidence) / 2, dof)

    def power_short_of_target(noncentrality: float) -> float:
        if np.isinf(dof):
            return stats.norm.sf(critical - noncentrality) - POWER
        return stats.nct.sf(critical, dof, noncentrality) - POWER

    bloom = critical + stats.t.ppf(POWER, dof)
    if dof < 1:
        # scipy's noncentral t loses its accuracy below 1 degree of freedom (near 0.2 its power falls as the effect
        # grows): Bloom's bound stands for the MDE there, which exceeds it
        return float(bloom * standard_error)
    noncentrality = optimize.brentq(power_short_of_target, 0, 2 * bloom)
    return float(noncentrality * standard_error)


def paired_difference(
    treatment: np.ndarray,
    control: np.ndarray,
    *,
    treatment_name: str,
    control_name: str,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
    margin: float | None = None,
) -> Difference:
    """`treatment` minus `control` where both are [seeds, problems] arrays of 0/1 correctness on the same
    problems in the same order: over one seed a bootstrap over problems (`n_resamples`, `seed`), over several the
    crossed seeds-by-problems t-interval (`crossed_interval`); `margin`: the experiment's equivalence margin."""
    treatment, control = np.atleast_2d(treatment).astype(float), np.atleast_2d(control).astype(float)
    if treatment.shape != control.shape or treatment.size == 0:
        raise ValueError(
            f"paired scores must have one equal, non-empty shape; got {treatment.shape} and {control.shape}"
        )
    differences = treatment - control
    n_seeds, n_problems = differences.shape
    if n_seeds == 1:
        draws = np.random.default_rng(seed).integers(0, n_problems, size=(n_resamples, n_problems))
        tail = (1 - confidence) / 2
        replicates = differences[0][draws].mean(axis=1)
        low, high = np.quantile(replicates, [tail, 1 - tail])
        mde = minimum_detectable_effect(replicates.std(ddof=1), np.inf, confidence)
    else:
        low, high, mde = crossed_interval(differences, confidence)
    return Difference(
        treatment=treatment_name,
        control=control_name,
        estimate=float(differences.mean()),
        low=float(low),
        high=float(high),
        seeds=n_seeds,
        problems=n_problems,
        mde=mde,
        margin=margin,
        confidence=confidence,
    )


class Interval(NamedTuple):
    """A mean's two-sided interval, and the smallest true effect its test detects with 80% power."""

    low: float
    high: float
    mde: float


def widest_interval(mean: float, errors: list[tuple[float, float]], confidence: float = CONFIDENCE) -> Interval:
    """The t-interval of `mean` at the widest of `errors` (standard error, degrees of freedom; inf: normal), with its
    minimum detectable effect from the same standard error and degrees of freedom."""
    from scipy import stats

    t_quantile = partial(stats.t.ppf, 1 - (1 - confidence) / 2)
    standard_error, dof = max(errors, key=lambda error: t_quantile(error[1]) * error[0])
    half_width = t_quantile(dof) * standard_error
    return Interval(
        float(mean - half_width), float(mean + half_width), minimum_detectable_effect(standard_error, dof, confidence)
    )


def crossed_interval(differences: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """The t-interval of the mean of a [seeds, problems] array (seeds >= 2), seeds and problems crossed random
    factors: variance (MS_seed + MS_problem - MS_residual) / (seeds x problems), each factor's mean square at least the
    residual's (so the variance is never below MS_residual / (seeds x problems)), with Satterthwaite's degrees of
    freedom; its half-width is at least that of the t-interval over the per-seed means (seeds - 1 degrees of
    freedom)."""
    return widest_interval(differences.mean(), crossed_errors(differences), confidence)


def crossed_errors(differences: np.ndarray, seeds: int | None = None) -> list[tuple[float, float]]:
    """`crossed_interval`'s standard errors with their degrees of freedom, of the mean over `seeds` seeds of the
    same problems (None: the array's own seeds): the seeds' component of the variance shrinks with the seeds, the
    problems' does not, as every seed is scored on the same problems. Each mean square is the one `seeds` seeds
    would have, with that design's degrees of freedom."""
    n_seeds, n_problems = differences.shape
    seeds = seeds or n_seeds
    by_seed = differences.mean(axis=1)
    errors = [(np.sqrt(by_seed.var(ddof=1) / seeds), seeds - 1)]  # the per-seed means' own
    if n_problems > 1:
        by_problem = differences.mean(axis=0)
        residual = differences - by_seed[:, None] - by_problem[None, :] + differences.mean()
        seed_dof, problem_dof = n_seeds - 1, n_problems - 1
        residual_square = (residual**2).sum() / (seed_dof * problem_dof)
        problem_excess = n_seeds * by_problem.var(ddof=1) - residual_square  # n_seeds x the problems' component
        # (mean square's share of the variance, with its sign; its degrees of freedom)
        terms = [(max(n_problems * by_seed.var(ddof=1), residual_square) / (seeds * n_problems), seeds - 1)]
        if problem_excess > 0:
            # at the residual's or below it the problems' mean square is the residual's, and the two terms are one
            # estimate that cancels: counted as two, Satterthwaite's degrees of freedom would fall towards 0
            problem_square = residual_square + seeds / n_seeds * problem_excess
            terms += [
                (problem_square / (seeds * n_problems), problem_dof),
                (-residual_square / (seeds * n_problems), (seeds - 1) * problem_dof),
            ]
        variance = sum(term for term, _ in terms)
        if variance > 0:
            errors.append((np.sqrt(variance), variance**2 / sum(term**2 / df for term, df in terms)))
    return errors


def seeds_interval(differences: np.ndarray, sampling_variances: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """The interval of the mean of per-seed `differences` (seeds >= 2): the t-interval over the seeds, its half-width
    at least the normal one that each seed's own sampling variance (`sampling_variances`, one per seed) gives the
    mean. A few seeds that agree by chance cannot make it narrower than what each of them measured allows."""
    n_seeds = len(differences)
    errors = [
        (np.sqrt(np.var(differences, ddof=1) / n_seeds), n_seeds - 1),
        (np.sqrt(np.sum(sampling_variances)) / n_seeds, np.inf),
    ]
    return widest_interval(np.mean(differences), errors, confidence)


def paired_scores(
    pairs: list[tuple[pl.DataFrame, pl.DataFrame]], column: str = "greedy_correct"
) -> tuple[np.ndarray, np.ndarray]:
    """[seeds, problems] arrays of `column` for the (treatment, control) score tables of each seed, over
    the problems every table scored (a null score, an ungraded check, is not scored), in one order."""
    if not pairs:
        raise ValueError("no score tables to compare")
    common = set.intersection(
        *(set(table.filter(pl.col(column).is_not_null())["problem_id"]) for pair in pairs for table in pair)
    )
    if not common:
        raise ValueError("the score tables share no eval problem")
    order = pl.DataFrame({"problem_id": sorted(common)})

    def column_of(table: pl.DataFrame) -> np.ndarray:
        return (
            order.join(table.select("problem_id", column), on="problem_id", how="left")[column]
            .cast(pl.Float64)
            .to_numpy()
        )

    return (
        np.stack([column_of(treatment) for treatment, _ in pairs]),
        np.stack([column_of(control) for _, control in pairs]),
    )
