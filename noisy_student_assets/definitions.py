"""The code location: assembles assets, checks and resources; no logic lives here."""

import dagster as dg

from noisy_student_assets.assets import models, problems
from resources.data_lake import DataLake
from resources.io_managers import CheckpointIOManager, ParquetIOManager

data_lake = DataLake()

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([problems, models]),
    resources={
        "data_lake": data_lake,
        "io_manager": ParquetIOManager(lake=data_lake),
        "checkpoint_io_manager": CheckpointIOManager(lake=data_lake),
    },
)
