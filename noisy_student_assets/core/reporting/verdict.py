"""Does a round beat its compute-matched control? Paired intervals that hold over seeds and problems (no Dagster here).

Both checkpoints are scored on the same eval problems, so the difference is paired by problem.

- One seed: a percentile bootstrap over problems (Efron & Tibshirani 1993; Koehn 2004, the paired bootstrap). It
  says nothing about seed-to-seed variation, and every sentence and outcome built on it says "one seed".
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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial

import numpy as np
import polars as pl
from scipy import stats

N_RESAMPLES = 10_000
CONFIDENCE = 0.95
ONE_SEED = ", one seed"


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
    confidence: float = CONFIDENCE

    @property
    def direction(self) -> str:
        """'better', 'worse' or 'no difference': where the interval lies against 0."""
        return direction(self.low, self.high)

    @property
    def outcome(self) -> str:
        """The direction, with ', one seed' where the interval is over problems alone (as the sentence says)."""
        return self.direction + (ONE_SEED if self.seeds == 1 else "")

    def sentence(self) -> str:
        """The result in one plain sentence. On one seed it says so: its interval is over eval problems alone and
        says nothing about seed-to-seed variation, so a gain there is not read as settled."""
        one_seed = self.seeds == 1
        reading = {
            "better": f"{self.treatment} {'is ahead of' if one_seed else 'beats'} {self.control}",
            "worse": f"{self.treatment} {'is behind' if one_seed else 'loses to'} {self.control}",
            "no difference": f"{self.treatment} is not distinguishable from {self.control}",
        }[self.direction]
        interval = f"{self.confidence:.0%} CI {self.low:+.3f} to {self.high:+.3f}"
        if one_seed:
            reading += " on one seed"
            detail = (
                f"{interval} over {self.problems} eval problems; 1 seed, so the interval says nothing about "
                "seed-to-seed variation: not a settled difference"
            )
        else:
            detail = (
                f"{interval}; {self.seeds} seeds x {self.problems} eval problems, t-interval over seeds and problems"
            )
        return f"{reading}: {self.estimate:+.3f} greedy accuracy ({detail})."

    def as_dict(self) -> dict:
        return asdict(self) | {"outcome": self.outcome}


def direction(low: float, high: float) -> str:
    """'better', 'worse' or 'no difference': where the interval from `low` to `high` lies against 0."""
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return "no difference"


def paired_difference(
    treatment: np.ndarray,
    control: np.ndarray,
    *,
    treatment_name: str,
    control_name: str,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Difference:
    """`treatment` minus `control` where both are [seeds, problems] arrays of 0/1 correctness on the same
    problems in the same order: over one seed a bootstrap over problems (`n_resamples`, `seed`), over several the
    crossed seeds-by-problems t-interval (`crossed_interval`)."""
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
        low, high = np.quantile(differences[0][draws].mean(axis=1), [tail, 1 - tail])
    else:
        low, high = crossed_interval(differences, confidence)
    return Difference(
        treatment=treatment_name,
        control=control_name,
        estimate=float(differences.mean()),
        low=float(low),
        high=float(high),
        seeds=n_seeds,
        problems=n_problems,
        confidence=confidence,
    )


def crossed_interval(differences: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The t-interval of the mean of a [seeds, problems] array (seeds >= 2), seeds and problems crossed random
    factors: variance (MS_seed + MS_problem - MS_residual) / (seeds x problems), each factor's mean square at least the
    residual's (so the variance is never below MS_residual / (seeds x problems)), with Satterthwaite's degrees of
    freedom; its half-width is at least that of the t-interval over the per-seed means (seeds - 1 degrees of
    freedom)."""
    n_seeds, n_problems = differences.shape
    mean = differences.mean()
    by_seed = differences.mean(axis=1)
    t_quantile = partial(stats.t.ppf, 1 - (1 - confidence) / 2)
    half_width = t_quantile(n_seeds - 1) * np.sqrt(by_seed.var(ddof=1) / n_seeds)  # the per-seed means' own interval
    if n_problems > 1:
        by_problem = differences.mean(axis=0)
        residual = differences - by_seed[:, None] - by_problem[None, :] + mean
        seed_dof, problem_dof = n_seeds - 1, n_problems - 1
        residual_square = (residual**2).sum() / (seed_dof * problem_dof)
        terms = [  # (mean square with its sign in the variance, its degrees of freedom)
            (max(n_problems * by_seed.var(ddof=1), residual_square), seed_dof),
            (max(n_seeds * by_problem.var(ddof=1), residual_square), problem_dof),
            (-residual_square, seed_dof * problem_dof),
        ]
        combined = sum(term for term, _ in terms)
        if combined > 0:
            dof = combined**2 / sum(term**2 / df for term, df in terms)
            half_width = max(half_width, t_quantile(dof) * np.sqrt(combined / (n_seeds * n_problems)))
    return float(mean - half_width), float(mean + half_width)


def seeds_interval(
    differences: np.ndarray, sampling_variances: np.ndarray, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The interval of the mean of per-seed `differences` (seeds >= 2): the t-interval over the seeds, its half-width
    at least the normal one that each seed's own sampling variance (`sampling_variances`, one per seed) gives the
    mean. A few seeds that agree by chance cannot make it narrower than what each of them measured allows."""
    n_seeds = len(differences)
    over_seeds = stats.t.ppf(1 - (1 - confidence) / 2, n_seeds - 1) * np.sqrt(np.var(differences, ddof=1) / n_seeds)
    within_seeds = stats.norm.ppf(1 - (1 - confidence) / 2) * np.sqrt(np.sum(sampling_variances)) / n_seeds
    half_width = max(over_seeds, within_seeds)
    return float(np.mean(differences) - half_width), float(np.mean(differences) + half_width)


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
