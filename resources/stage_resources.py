"""What every asset body uses, as one resource: the lake, the compute, the stage launcher, MLflow tracking and the
experiment files."""

import dagster as dg

from resources.compute import ComputeResource
from resources.data_lake import DataLake
from resources.experiments import ExperimentFiles
from resources.launchers import StageLauncher
from resources.tracking import MlflowTracking


class StageResources(dg.ConfigurableResource):
    """The resources `noisy_student_assets.defs.assets.stages.stage` runs an asset body with."""

    lake: DataLake
    compute: ComputeResource
    launcher: StageLauncher
    tracking: MlflowTracking
    experiments: ExperimentFiles
