"""The code location: assembles assets, jobs and resources; no logic lives here."""

import dagster as dg

from noisy_student_assets.assets import controls, models, problems, rounds
from noisy_student_assets.partitions import ROUNDS
from resources import lake_resources
from resources.data_lake import DataLake

foundation_job = dg.define_asset_job(
    "foundation_job",
    selection=dg.AssetSelection.groups(problems.GROUP, models.GROUP),
    description="Problems, base model, labeled RL, and the evaluations of both checkpoints.",
)
controls_job = dg.define_asset_job(
    "controls_job",
    selection=dg.AssetSelection.groups(controls.GROUP),
    description="The gold-label upper bound: a round's GRPO on the unlabeled problems' true answers, evaluated.",
)
round_job = dg.define_asset_job(
    "round_job",
    selection=dg.AssetSelection.groups(rounds.GROUP),
    partitions_def=ROUNDS,
    description="One Noisy Student round: sample, pseudo-label, train the student, evaluate it.",
)

ASSETS = dg.load_assets_from_modules([problems, models, controls, rounds])
ASSET_CHECKS = dg.load_asset_checks_from_modules([models, controls, rounds])
ASSETS_AND_CHECKS = [*ASSETS, *ASSET_CHECKS]
"""What `dg.materialize` takes to run any selection of this code location in-process (scripts, tests)."""

defs = dg.Definitions(
    assets=ASSETS,
    asset_checks=ASSET_CHECKS,
    jobs=[foundation_job, controls_job, round_job],
    resources=lake_resources(DataLake()),
)
