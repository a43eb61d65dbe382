"""MLflow tracking: one MLflow run per (asset, arm), tagged with the Dagster run that made it, its arm, round and
role, and named so that MLflow's runs table, which cuts long names at its column's width (14 characters in a
user's window), tells them apart (`run_name`). The runs are not nested under a parent per arm: MLflow's table
shows a parent collapsed, even under a filter that matches its children, so a round's runs would hide; `tags.arm`
groups them instead."""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from noisy_student_assets.core import environment, layout
from noisy_student_assets.core.experiments.arms import Arm
from resources.data_lake import DataLake
from resources.database import create_mlflow_schema, database_url, mlflow_store_uri

if TYPE_CHECKING:
    import mlflow

ARTIFACTS_DIR_NAME = "mlflow-artifacts"
ARM_TAG, EXPERIMENT_TAG, ROUND_TAG, ROLE_TAG = "arm", "experiment", "round", "role"
DAGSTER_RUN_URL_TAG = "dagster.run_url"
# MLflow 3.17's UI opens every experiment on its GenAI view (traces), where training runs do not show, unless the URL
# asks for the model-training view (or the browser remembers a click on "Model training"). Its global view switch is
# always on in 3.17, and then the experiment's `mlflow.experimentKind` tag is not read: only the URL can say it.
MODEL_TRAINING_VIEW = "workflowType=machine_learning"
CHECKPOINT_SUFFIX, EVAL_SUFFIX, VALIDATION_SUFFIX = "_checkpoint", "_eval", "_validation"
KINDS_OF_RUN = {CHECKPOINT_SUFFIX: "ckpt", EVAL_SUFFIX: "eval", VALIDATION_SUFFIX: "validation"}
"""The word a run's name starts with for an asset named `<subject><suffix>`: what kind of run it is comes before
whose, so that a checkpoint and its evaluation differ within what the runs table shows."""
STUDENT_EVAL = f"{layout.STUDENT_ROLE}{EVAL_SUFFIX}"
"""What a round's `eval_report` is named as in a run's name: the student's evaluation."""
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


def run_name(key_path: list[str], arm: str | None) -> str:
    """A run's name in MLflow's runs table: `<round> <kind> <subject> <arm>`, e.g. `r2 eval student default` for
    round_002/eval_report (the student's evaluation), `r2 ckpt labeled-only default` for the checkpoint of its
    labeled-only control, `eval labeled-rl default`, `problem-pool default`. The round is `r<N> `: a filter on
    `attributes.run_name LIKE 'r2 %'` finds round 2's runs (not round 12's), as `tags.round = 'round_002'` does."""
    *round_prefix, asset = key_path
    asset = STUDENT_EVAL if asset == layout.EVAL_REPORT else asset
    suffix = next((suffix for suffix in KINDS_OF_RUN if asset.endswith(suffix)), "")
    words = [
        f"r{layout.round_number(round_prefix[0])}" if round_prefix else "",
        KINDS_OF_RUN.get(suffix, ""),
        asset.removesuffix(suffix).replace("_", "-"),
        arm or "",
    ]
    return " ".join(word for word in words if word)


def role_of(asset_name: str) -> str:
    """What a round asset's run stands for: the student's chain or one of the controls."""
    return next((control for control in layout.CONTROLS if asset_name.startswith(control)), layout.STUDENT_ROLE)


ARM_ROLE = "arm"
"""The role of an arm's own run: its held-out accuracy by round (`MlflowTracking.log_by_round`)."""
BY_ROUND = "greedy_accuracy"
"""The metric an arm's run holds per checkpoint, stepped by round: `greedy_accuracy/student`, `.../labeled_only`."""


def round_points(key_path: list[str]) -> tuple[int, list[str]] | None:
    """Where an evaluation's greedy accuracy goes in its arm's run: the round (its step) and the lines it is a point
    of. Labeled RL is round 0 of the student's line (the summary's convention) and a line of its own; the base model
    is a line of its own; a round's evaluations are the student's and each control's. A validation split's is none."""
    *round_prefix, asset = key_path
    if round_prefix:
        if asset == layout.EVAL_REPORT:
            return layout.round_number(round_prefix[0]), [layout.STUDENT_ROLE]
        role = role_of(asset)
        return (layout.round_number(round_prefix[0]), [role]) if asset == layout.control_eval(role) else None
    return {
        layout.LABELED_RL_EVAL: (0, [layout.LABELED_RL.removesuffix(CHECKPOINT_SUFFIX), layout.STUDENT_ROLE]),
        layout.BASE_MODEL_EVAL: (0, [layout.BASE_MODEL]),
    }.get(asset)


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
        default="",
        description="where `mlflow ui` serves this store, which Dagster's `mlflow_run` metadata links to. Empty: "
        "NOISY_STUDENT_MLFLOW_URL if set, else http://127.0.0.1:5000, what `mlflow ui` serves without --host/--port",
    )
    dagster_ui_url: str = Field(
        default="http://127.0.0.1:3000",
        description="where `dagster dev` serves the UI: each MLflow run links its Dagster run there",
    )

    @property
    def resolved_ui_url(self) -> str:
        """Where the MLflow UI serves: `ui_url`, else the environment's (`environment.mlflow_url`)."""
        return self.ui_url.rstrip("/") or environment.mlflow_url()

    def run_url(self, experiment_id: str, run_id: str) -> str:
        """The MLflow UI's page of a run, in its model-training view."""
        return f"{self.resolved_ui_url}/#/experiments/{experiment_id}/runs/{run_id}?{MODEL_TRAINING_VIEW}"

    def runs_url(self, experiment_id: str) -> str:
        """The MLflow UI's table of the experiment's runs, in its model-training view (see `MODEL_TRAINING_VIEW`)."""
        return f"{self.resolved_ui_url}/#/experiments/{experiment_id}/runs?{MODEL_TRAINING_VIEW}"

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
        active inside the block so that TRL's MLflow callback logs into it too. Named by `run_name`; an arm's run
        also holds the arm's spec as params (`arm.*`)."""
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
        with self._store_lock():
            if self._shared_database:
                create_mlflow_schema(self._shared_database)
            experiment = mlflow.get_experiment_by_name(self.experiment_name)
            experiment_id = (
                experiment.experiment_id
                if experiment
                else mlflow.create_experiment(
                    # Artifacts beside the store, not in ./mlruns of whatever directory the run started in.
                    self.experiment_name,
                    artifact_location=(self.lake.root_path / ARTIFACTS_DIR_NAME).as_uri(),
                )
            )
            mlflow.set_experiment(experiment_id=experiment_id)
        if arm is not None:
            tags |= {ARM_TAG: arm.name, EXPERIMENT_TAG: arm.experiment}
            params = {"arm": arm.spec.model_dump(exclude_none=True)} | dict(params)
        with mlflow.start_run(run_name=run_name(key_path, arm.name if arm else None), tags=tags) as run:
            mlflow.log_params(flatten_params(params))
            yield run

    @contextmanager
    def _store_lock(self) -> Iterator[None]:
        """Held while creating what the store has one of: steps of one run start in parallel processes, and the first
        access creates the store's tables (a migration that two processes at once break: "duplicate column name"),
        the experiment, an arm's run."""
        with (self.lake.root_path / f"{layout.TRACKING_DB_NAME}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def log_by_round(self, arm: Arm, key_path: list[str], greedy_accuracy: float) -> None:
        """Add an evaluation's greedy accuracy to its arm's own run at its round (`round_points`), so that MLflow's
        chart view draws accuracy by round, a line per arm, and Compare of arms' runs opens on it."""
        points = round_points(key_path)
        if points is not None:
            step, lines = points
            self.log_to_arm_run(
                arm.name, arm.experiment, {f"{BY_ROUND}/{line}": greedy_accuracy for line in lines}, step
            )

    def log_to_arm_run(self, arm_name: str, experiment: str, metrics: Mapping[str, float], step: int) -> None:
        """Log `metrics` at `step` (a round) into arm `arm_name`'s own run (`arm <name>`, made by the first call, in
        the active run's experiment): its accuracy by round (`log_by_round`), the verdict's differences. A point it
        already holds at that step is not logged again."""
        import mlflow

        client = mlflow.MlflowClient(self.resolved_tracking_uri)
        experiment_id = mlflow.active_run().info.experiment_id
        with self._store_lock():
            (run, *_) = client.search_runs(
                [experiment_id], f"tags.{ROLE_TAG} = '{ARM_ROLE}' and tags.{ARM_TAG} = '{arm_name}'"
            ) or [
                client.create_run(
                    experiment_id,
                    run_name=f"{ARM_ROLE} {arm_name}",
                    tags={ROLE_TAG: ARM_ROLE, ARM_TAG: arm_name, EXPERIMENT_TAG: experiment},
                )
            ]
        for name, value in metrics.items():
            # an evaluation or verdict materialized again logs the same point again: MLflow would draw it twice
            logged = {(point.step, point.value) for point in client.get_metric_history(run.info.run_id, name)}
            if (step, float(value)) not in logged:
                client.log_metric(run.info.run_id, name, float(value), step=step)
        if run.info.status == "RUNNING":
            client.set_terminated(run.info.run_id)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Log `metrics` into the active run (see `start_run`) under MLflow-safe names (`metric_name`)."""
        import mlflow

        mlflow.log_metrics({metric_name(name): float(value) for name, value in metrics.items()}, step=step)
