"""MLflow tracking: one MLflow run per (asset, partition), tagged with the Dagster run that made it."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from resources.data_lake import DataLake

if TYPE_CHECKING:
    import mlflow

TRACKING_DB_NAME = "mlflow.db"
ARTIFACTS_DIR_NAME = "mlflow-artifacts"


def flatten_params(params: Mapping[str, object], prefix: str = "") -> dict[str, str]:
    """Nested settings as MLflow params: {"grpo": {"beta": 0}} -> {"grpo.beta": "0"}."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat |= flatten_params(value, prefix=f"{name}.")
        else:
            flat[name] = str(value)[:6000]  # MLflow's limit on a param value
    return flat


class MlflowTracking(dg.ConfigurableResource):
    """Plain mlflow around asset materializations. The default store is SQLite in the data lake
    (MLflow 3.17 refuses a ./mlruns file store); `mlflow ui --backend-store-uri <uri>` shows it."""

    lake: DataLake
    tracking_uri: str = Field(
        default="",
        description="empty: sqlite:///<data lake>/mlflow.db. A remote store: give it as dg.EnvVar and its credentials "
        "in MLflow's own variables (MLFLOW_TRACKING_TOKEN, _USERNAME, _PASSWORD), never in the URI",
    )
    experiment_name: str = Field(default="noisy-student")

    @property
    def resolved_tracking_uri(self) -> str:
        return self.tracking_uri or f"sqlite:///{self.lake.root_path / TRACKING_DB_NAME}"

    @contextmanager
    def start_run(
        self, context: dg.AssetExecutionContext, asset_name: str, params: Mapping[str, object]
    ) -> Iterator[mlflow.ActiveRun]:
        """An MLflow run for `asset_name` (and the context's partition) that is active inside the block,
        so TRL's MLflow callback logs into it too."""
        import mlflow  # here, not at import: loading the code location should not wait for mlflow

        # A remote store's URL would otherwise be printed to stdout (Dagster's compute logs) at every run's end.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.lake.root_path.mkdir(parents=True, exist_ok=True)
        mlflow.set_tracking_uri(self.resolved_tracking_uri)
        # Steps of one run start in parallel processes; the first access creates the SQLite schema (a
        # migration that two processes at once break: "duplicate column name") and the experiment.
        with (self.lake.root_path / f"{TRACKING_DB_NAME}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if mlflow.get_experiment_by_name(self.experiment_name) is None:
                # Artifacts beside the store, not in ./mlruns of whatever directory the run started in.
                mlflow.create_experiment(
                    self.experiment_name, artifact_location=(self.lake.root_path / ARTIFACTS_DIR_NAME).as_uri()
                )
            mlflow.set_experiment(self.experiment_name)
        partition = context.partition_key if context.has_partition_key else ""
        tags = {
            "dagster.run_id": context.run_id,
            "dagster.asset": asset_name,
            "dagster.partition": partition,
        }
        run_name = f"{asset_name}/{partition}" if partition else asset_name
        with mlflow.start_run(run_name=run_name, tags=tags) as run:
            mlflow.log_params(flatten_params(params))
            yield run

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        """Log `metrics` into the active run (see `start_run`)."""
        import mlflow

        mlflow.log_metrics({name: float(value) for name, value in metrics.items()})
