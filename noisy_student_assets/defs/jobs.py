"""Jobs over the code location's assets."""

import dagster as dg

from noisy_student_assets.core.settings import RUN_TIME_LIMIT_S
from noisy_student_assets.defs.partitions import ARMS, VERDICT_GROUP, round_group

ARM_JOB = "arm_job"
MAX_RUNTIME_TAG = "dagster/max_runtime"
RUN_TAGS = {MAX_RUNTIME_TAG: str(RUN_TIME_LIMIT_S)}
"""Every job's runs (launched from the UI, by the sensor, a job's backfill): run monitoring (dagster.yaml) stops one
past `RUN_TIME_LIMIT_S`. Job tags, not `run_tags`: a job's backfill gives its runs the job's tags alone. The grid's
runs, in its own process, have no daemon to stop them; their stages' limits do."""


def jobs(assets: dg.Definitions, rounds: int) -> dg.Definitions:
    """`shared_inputs_job`, `arm_job`, one job per round and `verdict_job` over `assets`."""
    shared = dg.AssetSelection.assets(*(a for a in assets.assets if a.partitions_def is None))
    round_jobs = [
        dg.define_asset_job(
            f"{round_group(number)}_job",
            selection=dg.AssetSelection.groups(round_group(number)),
            partitions_def=ARMS,
            tags=RUN_TAGS,
            description=f"Round {number} of an arm: sample, pseudo-label, train the student and its controls, evaluate.",
        )
        for number in range(1, rounds + 1)
    ]
    defined = [
        dg.define_asset_job(
            "shared_inputs_job",
            selection=shared - dg.AssetSelection.groups(VERDICT_GROUP),
            tags=RUN_TAGS,
            description="What every arm shares: the problem pool, the held-out eval set, the base model and its evaluation.",
        ),
        dg.define_asset_job(
            ARM_JOB,
            selection=dg.AssetSelection.all() - shared,
            partitions_def=ARMS,
            tags=RUN_TAGS,
            description="Everything of one arm: its split, labeled RL, every round and every control, with their evaluations.",
        ),
        *round_jobs,
        dg.define_asset_job(
            "verdict_job", selection=dg.AssetSelection.groups(VERDICT_GROUP), tags=RUN_TAGS, description="The verdict across every registered arm."
        ),
    ]
    return dg.Definitions(jobs=defined)
