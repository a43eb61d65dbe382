"""The code location, merged from the definitions of each asset module; no logic lives here."""

import dagster as dg

from noisy_student_assets.core.experiments.progress import AskedFor
from noisy_student_assets.defs.assets import controls, models, problems, promotion, rounds, verdict
from noisy_student_assets.defs.automation import next_round_automation, with_round_automation
from noisy_student_assets.defs.current_defaults import current_defaults
from noisy_student_assets.defs.jobs import jobs
from noisy_student_assets.defs.lineage import with_code_versions
from noisy_student_assets.defs.partitions import ASKED_FOR, ROUNDS
from resources import lake_resources
from resources.data_lake import DataLake


def asset_definitions(asked_for: AskedFor) -> dg.Definitions:
    """Rounds 1..ROUNDS' assets, with the controls, verifiers and validations `asked_for` lists."""
    return dg.Definitions.merge(
        problems.defs,
        models.definitions(asked_for),
        *(rounds.round_definitions(number, asked_for) for number in range(1, ROUNDS + 1)),
        dg.Definitions(assets=[promotion.teacher_asset(number, asked_for) for number in range(2, ROUNDS + 1)]),
        *(controls.round_controls(number, asked_for) for number in range(1, ROUNDS + 1)),
        verdict.defs,
    )


ASSET_DEFINITIONS = with_code_versions(
    with_round_automation(asset_definitions(ASKED_FOR)), every=asset_definitions(AskedFor.everything())
)
defs = dg.Definitions.merge(
    ASSET_DEFINITIONS,
    jobs(ASSET_DEFINITIONS, ROUNDS),
    next_round_automation(ASSET_DEFINITIONS),
    current_defaults(ASSET_DEFINITIONS),
    dg.Definitions(resources=lake_resources(DataLake())),
)

ASSETS_AND_CHECKS = [*ASSET_DEFINITIONS.assets, *ASSET_DEFINITIONS.asset_checks]
"""What `dg.materialize` takes to run any selection of this code location in-process (scripts, tests)."""
