"""The code location: assembles assets, checks, jobs and resources; no logic lives here."""

import dagster as dg

from noisy_student_assets.defs.assets import controls, models, problems, rounds, verdict
from noisy_student_assets.defs.partitions import ARMS, ROUNDS, round_group
from noisy_student_assets.defs.sensors import build_next_round_sensor
from resources import lake_resources
from resources.data_lake import DataLake

ROUND_DEFINITIONS = [
    definition for number in range(1, ROUNDS + 1) for definition in (*rounds.round_assets(number), *controls.round_controls(number))
]
ROUND_CHECKS = [d for d in ROUND_DEFINITIONS if isinstance(d, dg.AssetChecksDefinition)]
ASSETS = [*dg.load_assets_from_modules([problems, models, verdict]), *(d for d in ROUND_DEFINITIONS if d not in ROUND_CHECKS)]
ASSET_CHECKS = [*dg.load_asset_checks_from_modules([models]), *ROUND_CHECKS]
ASSETS_AND_CHECKS = [*ASSETS, *ASSET_CHECKS]
"""What `dg.materialize` takes to run any selection of this code location in-process (scripts, tests)."""

PER_ARM = dg.AssetSelection.all() - dg.AssetSelection.assets(*(a for a in ASSETS if a.partitions_def is None))

shared_inputs_job = dg.define_asset_job(
    "shared_inputs_job",
    selection=dg.AssetSelection.assets(*(a for a in ASSETS if a.partitions_def is None)) - dg.AssetSelection.groups(verdict.GROUP),
    description="What every arm shares: the problem pool, the held-out eval set, the base model and its evaluation.",
)
arm_job = dg.define_asset_job(
    "arm_job",
    selection=PER_ARM,
    partitions_def=ARMS,
    description="Everything of one arm: its split, labeled RL, every round and every control, with their evaluations.",
)
round_jobs = [
    dg.define_asset_job(
        f"{round_group(number)}_job",
        selection=dg.AssetSelection.groups(round_group(number)),
        partitions_def=ARMS,
        description=f"Round {number} of an arm: sample, pseudo-label, train the student and its controls, evaluate.",
    )
    for number in range(1, ROUNDS + 1)
]
verdict_job = dg.define_asset_job(
    "verdict_job", selection=dg.AssetSelection.groups(verdict.GROUP), description="The verdict across every registered arm."
)

defs = dg.Definitions(
    assets=ASSETS,
    asset_checks=ASSET_CHECKS,
    jobs=[shared_inputs_job, arm_job, *round_jobs, verdict_job],
    sensors=[build_next_round_sensor(round_jobs)] if round_jobs else [],
    resources=lake_resources(DataLake()),
)
