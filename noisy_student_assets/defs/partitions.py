"""Arms as partitions, rounds as asset-key prefixes.

Round N's teacher is round N-1's student. Dagster 1.13 accepts an asset that depends on its own earlier
partition only on time-window partitions, which drew rounds as days of 1900 and hid the teacher edge in
the UI. Here every round has assets of its own (`round_002/pseudo_labels`), made by a factory, so each
teacher is an ordinary input edge; arms are a dynamic partition (`arm`) of every per-arm asset, so a
backfill over arms runs each arm's rounds in dependency order (see docs/design.md, "Rounds and arms in Dagster").

The number of rounds is fixed when the code location loads: the most rounds any experiment file asks for
(`experiments.max_rounds`); "Reload definitions" in the UI picks up a raised count.
"""

import dagster as dg

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import load_experiments, max_rounds
from noisy_student_assets.core.experiments.directory import default_experiments_dir
from noisy_student_assets.core.experiments.progress import AskedFor

ARMS = dg.DynamicPartitionsDefinition(name="arm")

VERDICT_GROUP = "experiments"
"""The group of the assets that compare arms (the verdict)."""

_EXPERIMENTS = load_experiments(default_experiments_dir()).values()

ROUNDS = max_rounds(_EXPERIMENTS)
"""Rounds 1..ROUNDS are defined."""

ASKED_FOR = AskedFor.of(_EXPERIMENTS)
"""The controls, verifiers and validation evals defined: those some arm of the experiment files runs. "Reload
definitions" picks up a file that asks for more."""


def round_key(number: int, name: str) -> dg.AssetKey:
    """The key of a round's asset: `round_003/pseudo_labels`."""
    return dg.AssetKey(layout.round_asset(number, name))


def teacher_key(number: int) -> dg.AssetKey:
    """Round 1's teacher is the arm's labeled-RL checkpoint; round N's is the one promoted from round N-1's student
    and teacher (`round_00N/teacher`)."""
    return round_key(number, layout.TEACHER) if number > 1 else dg.AssetKey(layout.LABELED_RL)


def teacher_source_key(number: int) -> dg.AssetKey:
    """What a new teacher of round `number` follows from: labeled RL for round 1, round N-1's student for round N
    (whichever model its promotion then picks)."""
    return round_key(number - 1, layout.STUDENT) if number > 1 else dg.AssetKey(layout.LABELED_RL)


def labeled_only_init_key(number: int) -> dg.AssetKey:
    """The labeled-only control continues its own chain: round 1 from labeled RL, round N from round N-1."""
    name = layout.control_checkpoint(layout.LABELED_ONLY)
    return round_key(number - 1, name) if number > 1 else dg.AssetKey(layout.LABELED_RL)


def round_group(number: int) -> str:
    return layout.round_prefix(number)
