"""Dagster resources and IO managers of noisy-student."""

from resources.compute import ComputeResource
from resources.data_lake import DataLake
from resources.experiments import ExperimentFiles
from resources.io_managers import CheckpointIOManager, DirectoryIOManager, EvalIOManager, ParquetIOManager
from resources.launchers import StageLauncher, code_location_launcher
from resources.stage_resources import StageResources
from resources.tracking import MlflowTracking


def lake_resources(
    lake: DataLake,
    compute: ComputeResource | None = None,
    experiments: ExperimentFiles | None = None,
    launcher: StageLauncher | None = None,
) -> dict:
    """Every resource the assets need, all on `lake`: the code location's set, and the set a script or
    test materializes with into a lake of its own."""
    compute = compute or ComputeResource()
    stage_resources = StageResources(
        lake=lake,
        compute=compute,
        launcher=launcher or code_location_launcher(),
        tracking=MlflowTracking(lake=lake),
        experiments=experiments or ExperimentFiles(),
    )
    return {
        "data_lake": lake,
        "compute": compute,
        "io_manager": ParquetIOManager(lake=lake),
        "checkpoint_io_manager": CheckpointIOManager(lake=lake),
        "eval_io_manager": EvalIOManager(lake=lake),
        "directory_io_manager": DirectoryIOManager(lake=lake),
        "stage_resources": stage_resources,
    }
