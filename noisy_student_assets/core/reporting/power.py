"""How many seeds an experiment needs, planned from the seeds it has before more are spent (no Dagster here).

Each comparison of an arm group's last round (every checkpoint against its labeled-only control, as in the summary's
table) has the variance components its verdict estimates (`verdict.crossed_errors`): with more seeds of the same
problems the seeds' share shrinks and the problems' does not. The seeds an effect needs are the fewest at which the
verdict's interval detects it with 80% power (its minimum detectable effect at most the effect). A group with fewer
seeds than a pilot has nothing to project from, and the table says how many more its pilot needs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import Arm
from noisy_student_assets.core.lake_reader import ArmLake
from noisy_student_assets.core.reporting import verdict
from noisy_student_assets.core.reporting.summary import ROLES, arm_evaluations, group_label
from noisy_student_assets.core.reporting.verdict import PILOT_SEEDS

MOST_SEEDS = 100
"""Past this many seeds the problems' own variance is what is left: more problems, not seeds."""


def seed_hours(lake: Path, arms: list[Arm]) -> dict[tuple[int, int], float]:
    """The hours the grid's runs of each seed of `arms` (split seed, seed) took, summed over that seed's arms that
    `lake` (or a results directory) records: the arms of one seed read back one another's labeled RL, samples and
    controls, which only the first to run pays, so one arm's hours leave them out and a seed's sum counts them
    once."""
    hours: dict[tuple[int, int], float] = {}
    for arm in arms:
        if (spent := ArmLake(lake, arm.name).grid_hours()) is not None:
            seed = (arm.split_seed, arm.seed)
            hours[seed] = hours.get(seed, 0.0) + spent.hours
    return hours


def seeds_column(effect: float) -> str:
    """The power table's column of the seeds `effect` needs."""
    return f"seeds for {effect:g}"


def seeds_needed(differences: np.ndarray, effect: float) -> int | None:
    """The fewest seeds (2 or more) at which the crossed interval over the same problems detects `effect` with 80%
    power, projected from the variance components of `differences` ([seeds, problems], seeds >= 2); None where
    `MOST_SEEDS` do not."""
    for seeds in range(2, MOST_SEEDS + 1):
        if verdict.widest_interval(0.0, verdict.crossed_errors(differences, seeds)).mde <= effect:
            return seeds
    return None


def power_table(lake: Path, arms: list[Arm], effects: list[float], hours_per_seed: float | None) -> pl.DataFrame:
    """Per arm group and checkpoint of its last round against the labeled-only control: the seeds it has, its MDE
    now, and per effect in `effects` the seeds it needs and the hours the seeds still to run cost at `hours_per_seed`
    (None: not measured)."""
    groups: dict[str, list[Arm]] = {}
    for arm in arms:
        groups.setdefault(group_label(arm), []).append(arm)
    rows = []
    for group, members in groups.items():
        rounds = max(arm.stopping_rule.max_rounds for arm in members)
        runs = [arm_evaluations(lake, arm.name, rounds) for arm in members]
        done = [number for number in range(rounds, 0, -1) if any((number, layout.LABELED_ONLY) in run for run in runs)]
        if not done:
            continue
        number = done[0]
        for role in ROLES:
            pairs = [
                (run[(number, role)].scores, run[(number, layout.LABELED_ONLY)].scores)
                for run in runs
                if role != layout.LABELED_ONLY and (number, role) in run and (number, layout.LABELED_ONLY) in run
            ]
            if not pairs:
                continue
            treatment, control = verdict.paired_scores(pairs)
            difference = verdict.paired_difference(
                treatment, control, treatment_name=role, control_name=layout.LABELED_ONLY
            )
            row = {"group": group, "round": number, "checkpoint": role, "seeds": len(pairs), "mde": difference.mde}
            for effect in effects:
                needed = seeds_needed(treatment - control, effect) if len(pairs) >= PILOT_SEEDS else None
                row[seeds_column(effect)] = needed
                row[f"hours to add for {effect:g}"] = (
                    max(needed - len(pairs), 0) * hours_per_seed
                    if needed is not None and hours_per_seed is not None
                    else None
                )
            row["pilot"] = "done" if len(pairs) >= PILOT_SEEDS else f"run {PILOT_SEEDS - len(pairs)} more seeds first"
            rows.append(row)
    return pl.DataFrame(rows)
