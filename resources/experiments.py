"""The experiment files, as the assets see them: which arm a partition key names, with what overrides."""

from pathlib import Path

import dagster as dg
from pydantic import Field

from noisy_student_assets.core.experiments.arms import (
    EXPERIMENT_SUFFIX,
    Arm,
    Experiment,
    find_arm,
    load_experiment,
)
from noisy_student_assets.core.experiments.directory import default_experiments_dir


class ExperimentFiles(dg.ConfigurableResource):
    """Where the experiment files live (`experiments/*.yaml`; the code location reads the same directory)."""

    directory: str = Field(
        default=str(default_experiments_dir()),
        description="directory of the experiment files (NOISY_STUDENT_EXPERIMENTS)",
    )

    @property
    def path(self) -> Path:
        return Path(self.directory)

    def arm(self, name: str) -> Arm:
        try:
            return find_arm(self.path, name)
        except KeyError as error:
            raise dg.Failure(str(error.args[0]), allow_retries=False) from error

    def experiment(self, arm: Arm) -> Experiment:
        """The experiment that declares `arm` (its file only: `arm` found it among all of them)."""
        return load_experiment(self.path / f"{arm.experiment}{EXPERIMENT_SUFFIX}")
