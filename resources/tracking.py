"""MLflow tracking: one MLflow run per (asset, arm), tagged with the Dagster run that made it, its arm,
round and role, and nested under a parent run per arm, so that the MLflow UI compares arms side by side."""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import Arm
from resources.data_lake import DataLake
from resources.database import create_mlflow_schema, database_url, mlflow_store_uri

if TYPE_CHECKING:
    import mlflow

ARTIFACTS_DIR_NAME = "mlflow-artifacts"
ARM_TAG, EXPERIMENT_TAG, ROUND_TAG, ROLE_TAG = "arm", "experiment", "round", "role"
PARENT_OF_ARM_TAG = "parent_of_arm"
"""Set on the one parent run of an arm, whose value is the arm."""
DAGSTER_RUN_URL_TAG = "dagster.run_url"
# MLflow 3.17's UI opens an experiment on its GenAI view (traces), where training runs do not show, unless the
# experiment's kind says model training, or the URL (or the browser, once "Model training" was clicked) asks for it.
MODEL_TRAINING_VIEW = "workflowType=machine_learning"
EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
NOTE_TAG = "mlflow.note.content"
"""A run's description, which the MLflow UI renders as markdown (links included)."""


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


def metric_name(name: str) -> str:
    """MLflow metric names allow letters, digits, _ - . / and space: "maj@8" -> "maj_at_8", "tau=0.5" -> "tau_0.5"."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name.replace("@", "_at_"))


def role_of(asset_name: str) -> str:
    """What a round asset's run stands for: the student's chain or one of the controls."""
    return next((control for control in layout.CONTROLS if asset_name.startswith(control)), layout.STUDENT_ROLE)


class MlflowTracking(dg.ConfigurableResource):
    """Plain mlflow around asset materializations. The default store is SQLite in the data lake
    (MLflow 3.17 refuses a ./mlruns file store), or the shared database's schema `mlflow` when
    NOISY_STUDENT_DATABASE_URL is set (resources/database.py); `mlflow ui --backend-store-uri <uri>` shows it."""

    lake: DataLake
    tracking_uri: str = Field(
        default="",
        description="empty: the schema mlflow of the shared database (NOISY_STUDENT_DATABASE_URL) if set, else "
        "sqlite:///<data lake>/mlflow.db. A remote store: give it as dg.EnvVar and its credentials "
        "in MLflow's own variables (MLFLOW_TRACKING_TOKEN, _USERNAME, _PASSWORD), never in the URI",
    )
    experiment_name: str = Field(default="noisy-student", description="the MLflow experiment every run goes into")
    ui_url: str = Field(
        default="http://127.0.0.1:5000",
        description="where `mlflow ui` serves this store: Dagster metadata links runs there",
    )
    dagster_ui_url: str = Field(
        default="http://127.0.0.1:3000",
        description="where `dagster dev` serves the UI: each MLflow run links its Dagster run there",
    )

    def run_url(self, experiment_id: str, run_id: str) -> str:
        """The MLflow UI's page of a run."""
        return f"{self.ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{MODEL_TRAINING_VIEW}"

    @property
    def resolved_tracking_uri(self) -> str:
        shared = self._shared_database
        return self.tracking_uri or (
            mlflow_store_uri(shared) if shared else f"sqlite:///{self.lake.root_path / layout.TRACKING_DB_NAME}"
        )

    @property
    def _shared_database(self) -> str | None:
        """The shared database the store is in, unless `tracking_uri` names a store of its own."""
        return None if self.tracking_uri else database_url()

    @contextmanager
    def start_run(
        self, context: dg.AssetExecutionContext, params: Mapping[str, object], arm: Arm | None, name: str | None = None
    ) -> Iterator[mlflow.ActiveRun]:
        """An MLflow run for the asset being materialized (`name`: the multi-asset's, else the asset key),
        active inside the block so that TRL's MLflow callback logs into it too. Named `<asset> <round> <arm>`;
        a child of the arm's parent run."""
        import mlflow  # here, not at import: loading the code location should not wait for mlflow

        # A remote store's URL would otherwise be printed to stdout (Dagster's compute logs) at every run's end.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.lake.root_path.mkdir(parents=True, exist_ok=True)
        mlflow.set_tracking_uri(self.resolved_tracking_uri)
        key_path = name.split("/") if name else list(context.asset_key.path)
        round_name = key_path[0] if len(key_path) > 1 else ""
        dagster_ui = self.dagster_ui_url.rstrip("/")
        run_url = f"{dagster_ui}/runs/{context.run_id}"
        asset_url = f"{dagster_ui}/assets/{'/'.join(key_path)}"
        tags = {
            "dagster.run_id": context.run_id,
            DAGSTER_RUN_URL_TAG: run_url,
            NOTE_TAG: f"Made by Dagster run [{context.run_id[:8]}]({run_url}) "
            f"materializing [{'/'.join(key_path)}]({asset_url})" + (f", arm `{arm.name}`." if arm else "."),
            "dagster.asset": "/".join(key_path),
            "dagster.partition": arm.name if arm else "",
            ROUND_TAG: round_name,
            ROLE_TAG: role_of(key_path[-1]) if round_name else key_path[-1],
        }
        # Steps of one run start in parallel processes; the first access creates the store's tables (a
        # migration that two processes at once break: "duplicate column name"), the experiment and the arm's parent.
        with (self.lake.root_path / f"{layout.TRACKING_DB_NAME}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._shared_database:
                create_mlflow_schema(self._shared_database)
            experiment = mlflow.get_experiment_by_name(self.experiment_name)
            experiment_id = (
                experiment.experiment_id
                if experiment
                else mlflow.create_experiment(
                    # Artifacts beside the store, not in ./mlruns of whatever directory the run started in. The kind
                    # opens the experiment in MLflow's model-training view, not its GenAI view (traces, prompts),
                    # which is empty here.
                    self.experiment_name,
                    artifact_location=(self.lake.root_path / ARTIFACTS_DIR_NAME).as_uri(),
                    tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND},
                )
            )
            mlflow.set_experiment(experiment_id=experiment_id)
            if arm is not None:
                tags |= {
                    ARM_TAG: arm.name,
                    EXPERIMENT_TAG: arm.experiment,
                    "mlflow.parentRunId": self._arm_parent(experiment_id, arm),
                }
        # The asset's key path first ("round_001/eval_report a"): MLflow's run list cuts long names at their end.
        run_name = " ".join(part for part in ("/".join(key_path), arm.name if arm else "") if part)
        with mlflow.start_run(run_name=run_name, tags=tags) as run:
            mlflow.log_params(flatten_params(params))
            yield run

    def _arm_parent(self, experiment_id: str, arm: Arm) -> str:
        """The id of the arm's parent run (made on first use, holding the arm's spec as params)."""
        client = self._client()
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.{PARENT_OF_ARM_TAG} = '{arm.name}'", max_results=1
        )
        if found:
            return found[0].info.run_id
        parent = client.create_run(
            experiment_id,
            run_name=f"arm {arm.name}",
            tags={PARENT_OF_ARM_TAG: arm.name, ARM_TAG: arm.name, EXPERIMENT_TAG: arm.experiment},
        )
        for key, value in flatten_params({"arm": arm.spec.model_dump(exclude_none=True)}).items():
            client.log_param(parent.info.run_id, key, value)
        client.set_terminated(parent.info.run_id)
        return parent.info.run_id

    def _client(self):
        import mlflow

        return mlflow.MlflowClient(self.resolved_tracking_uri)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Log `metrics` into the active run (see `start_run`) under MLflow-safe names (`metric_name`)."""
        import mlflow

        mlflow.log_metrics({metric_name(name): float(value) for name, value in metrics.items()}, step=step)
