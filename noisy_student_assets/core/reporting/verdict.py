"""Does a round beat its compute-matched control? Paired bootstrap intervals (no Dagster here).

Both checkpoints are scored on the same eval problems, so the difference is paired by problem: each
bootstrap replicate resamples problems (Efron & Tibshirani 1993, "An Introduction to the Bootstrap";
Koehn 2004, "Statistical Significance Tests for Machine Translation Evaluation", the paired bootstrap).
When arms differ only by seed, seeds are resampled too, independently of problems: seeds and problems
are crossed factors, and resampling both is the pigeonhole bootstrap (Owen 2007, "The pigeonhole
bootstrap", Annals of Applied Statistics), which does not pretend that three seeds are three hundred.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import polars as pl

N_RESAMPLES = 10_000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Difference:
    """Mean accuracy of a treatment minus its control, with a bootstrap percentile interval."""

    treatment: str
    control: str
    estimate: float
    low: float
    high: float
    seeds: int
    problems: int
    confidence: float = CONFIDENCE

    @property
    def outcome(self) -> str:
        """'better', 'worse' or 'no difference' at the interval's confidence."""
        if self.low > 0:
            return "better"
        if self.high < 0:
            return "worse"
        return "no difference"

    def sentence(self) -> str:
        """The result in one plain sentence. On one seed it says so: its interval is over eval problems alone and
        says nothing about seed-to-seed variation, so a gain there is not read as settled."""
        one_seed = self.seeds == 1
        reading = {
            "better": f"{self.treatment} {'is ahead of' if one_seed else 'beats'} {self.control}",
            "worse": f"{self.treatment} {'is behind' if one_seed else 'loses to'} {self.control}",
            "no difference": f"{self.treatment} is not distinguishable from {self.control}",
        }[self.outcome]
        interval = f"{self.confidence:.0%} CI {self.low:+.3f} to {self.high:+.3f}"
        if one_seed:
            reading += " on one seed"
            detail = (
                f"{interval} over {self.problems} eval problems; 1 seed, so the interval says nothing about "
                "seed-to-seed variation: not a settled difference"
            )
        else:
            detail = f"{interval}; {self.seeds} seeds x {self.problems} eval problems, paired bootstrap"
        return f"{reading}: {self.estimate:+.3f} greedy accuracy ({detail})."

    def as_dict(self) -> dict:
        return asdict(self) | {"outcome": self.outcome}


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
    problems in the same order. Each replicate draws seeds and problems with replacement, independently."""
    treatment, control = np.atleast_2d(treatment).astype(float), np.atleast_2d(control).astype(float)
    if treatment.shape != control.shape or treatment.size == 0:
        raise ValueError(f"paired scores must have one equal, non-empty shape; got {treatment.shape} and {control.shape}")
    differences = treatment - control
    n_seeds, n_problems = differences.shape
    rng = np.random.default_rng(seed)
    problem_draws = rng.integers(0, n_problems, size=(n_resamples, n_problems))
    seed_draws = rng.integers(0, n_seeds, size=(n_resamples, n_seeds))
    # Mean over the drawn problems, for every seed and replicate: [seeds, replicates].
    by_seed = np.stack([row[problem_draws].mean(axis=1) for row in differences])
    replicates = np.take_along_axis(by_seed, seed_draws.T, axis=0).mean(axis=0)
    tail = (1 - confidence) / 2
    low, high = np.quantile(replicates, [tail, 1 - tail])
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


def paired_scores(pairs: list[tuple[pl.DataFrame, pl.DataFrame]], column: str = "greedy_correct") -> tuple[np.ndarray, np.ndarray]:
    """[seeds, problems] arrays of `column` for the (treatment, control) score tables of each seed, over
    the problems every table scored (a null score, an ungraded check, is not scored), in one order."""
    if not pairs:
        raise ValueError("no score tables to compare")
    common = set.intersection(*(set(table.filter(pl.col(column).is_not_null())["problem_id"]) for pair in pairs for table in pair))
    if not common:
        raise ValueError("the score tables share no eval problem")
    order = pl.DataFrame({"problem_id": sorted(common)})

    def column_of(table: pl.DataFrame) -> np.ndarray:
        return order.join(table.select("problem_id", column), on="problem_id", how="left")[column].cast(pl.Float64).to_numpy()

    return (
        np.stack([column_of(treatment) for treatment, _ in pairs]),
        np.stack([column_of(control) for _, control in pairs]),
    )
