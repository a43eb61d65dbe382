"""The shared instance (NOISY_STUDENT_DATABASE_URL) on a real PostgreSQL server: `dagster dev`'s webserver, daemon
and run processes, and a grid's two arms in processes of their own at once, write one Dagster instance and one
MLflow store in the database, and nothing into the embedded SQLite stores (tiny model)."""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg
import mlflow
import pytest
import sqlalchemy
from dagster._core.execution.backfill import BulkActionStatus
from dagster_postgres import DagsterPostgresStorage

from noisy_student_assets.core import layout
from noisy_student_assets.defs.partitions import ARMS as ARMS_DEF
from resources.database import MLFLOW_SCHEMA, mlflow_store_uri
from resources.tracking import ARM_TAG
from tests.cli import DagsterCli, graphql, own_device_lock, run_failures
from tests.conftest import TEST_EXPERIMENTS
from tests.tiny_configs import tiny_config

pytestmark = pytest.mark.postgres

TWO_ARMS = TEST_EXPERIMENTS / "two_arms.yaml"
ARMS = ("p", "q")


def shared_instance(cli: DagsterCli) -> dg.DagsterInstance:
    instance = dg.DagsterInstance.from_config(str(cli.home))
    assert isinstance(instance.get_ref().storage, DagsterPostgresStorage)
    return instance


def mlflow_runs(url: str) -> list:
    """Every run of the experiment `noisy-student` in the MLflow store of the database at `url`."""
    client = mlflow.MlflowClient(mlflow_store_uri(url))
    return client.search_runs([client.get_experiment_by_name("noisy-student").experiment_id])


def tables(url: str, schema: str) -> set[str]:
    """The tables of `schema` in the database at `url`."""
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.NullPool)
    try:
        return set(sqlalchemy.inspect(engine).get_table_names(schema=schema))
    finally:
        engine.dispose()


def assert_nothing_embedded(cli: DagsterCli) -> None:
    assert not (cli.lake / ".dagster" / "storage").exists(), "the instance's SQLite storage was used"
    assert not (cli.lake / layout.TRACKING_DB_NAME).exists(), "MLflow's SQLite store was used"


LAUNCH_BACKFILL = """
mutation ($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}"""
# Each run's steps in its own process: a process per step would start Python and import torch for each (CI time).
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}
TASK = (layout.PROBLEM_POOL, layout.EVAL_PROBLEMS)
SPLIT = (layout.LABELED_PROBLEMS, layout.UNLABELED_PROBLEMS, layout.VALIDATION_PROBLEMS)


def test_a_backfill_launched_through_the_webserver_runs_on_the_shared_database(
    shared_cli: DagsterCli, database_url: str
) -> None:
    """`dagster dev` on the database: the webserver records the backfill the UI's launch sends, the daemon runs it,
    and the processes it starts for runs find the instance in the environment they inherit."""
    with shared_instance(shared_cli) as instance:
        instance.add_dynamic_partitions(ARMS_DEF.name, list(ARMS))
    with shared_cli.dev() as url:
        params = {
            "assetSelection": [{"path": [name]} for name in (*TASK, *SPLIT)],
            "partitionNames": list(ARMS),
            "runConfigData": IN_PROCESS,
        }
        launched = graphql(url, LAUNCH_BACKFILL, {"params": params})["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        with shared_instance(shared_cli) as instance:
            deadline = time.monotonic() + 300
            while (status := instance.get_backfill(launched["backfillId"]).status) == BulkActionStatus.REQUESTED:
                assert time.monotonic() < deadline, "the backfill did not finish in 5 minutes"
                time.sleep(2)
    with shared_instance(shared_cli) as instance:
        records = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": launched["backfillId"]}))
        assert status == BulkActionStatus.COMPLETED_SUCCESS, (
            run_failures(instance, records) or (shared_cli.home / "dagster-dev.log").read_text()[-4000:]
        )
        for arm in ARMS:
            for name in (*TASK, *SPLIT):
                filter_ = dg.AssetRecordsFilter(asset_key=dg.AssetKey(name), asset_partitions=[arm])
                assert instance.fetch_materializations(filter_, limit=1).records, (arm, name)
    assert {"runs", "event_logs", "alembic_version"} <= tables(database_url, "public")
    assert {"runs", "experiments", "alembic_version"} <= tables(database_url, MLFLOW_SCHEMA)
    logged = {(run.data.tags.get("dagster.asset"), run.data.tags.get(ARM_TAG)) for run in mlflow_runs(database_url)}
    # Per arm: a run per problem table of its task and one for the split (a multi-asset); no parent run per arm.
    assert logged == {(name, arm) for arm in ARMS for name in (*TASK, "problem_split")}
    assert_nothing_embedded(shared_cli)


def test_two_arms_at_once_write_one_instance_and_one_mlflow_store(
    shared_cli: DagsterCli, database_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "grid.log"
    config = tiny_config(tiny_model_dir, rounds=1)
    options = ("--parallel-arms", "2", "--launcher", "inprocess", "--rounds", "0")
    grid = shared_cli.grid(TWO_ARMS, config, log, *options, env=own_device_lock(shared_cli))
    assert grid.wait(timeout=900) == 0, log.read_text()[-4000:]

    with shared_instance(shared_cli) as instance:
        runs = {
            record.dagster_run.tags.get("dagster/partition"): record
            for record in instance.get_run_records(dg.RunsFilter(tags={"noisy_student/experiment": "two_arms"}))
        }
        assert all(record.dagster_run.status == dg.DagsterRunStatus.SUCCESS for record in runs.values())
        p, q = runs["p"], runs["q"]
        assert p.start_time < q.end_time and q.start_time < p.end_time, "the two arms' runs wrote the instance at once"
        for arm in ARMS:
            for name in (layout.LABELED_RL, layout.LABELED_RL_EVAL):
                filter_ = dg.AssetRecordsFilter(asset_key=dg.AssetKey(name), asset_partitions=[arm])
                assert len(instance.fetch_materializations(filter_, limit=5).records) == 1, (arm, name)
        assert instance.fetch_materializations(dg.AssetKey(layout.VERDICT), limit=1).records

    logged = mlflow_runs(database_url)
    for arm in ARMS:
        trained = [
            run
            for run in logged
            if run.data.tags.get("dagster.asset") == layout.LABELED_RL and run.data.tags.get(ARM_TAG) == arm
        ]
        (run,) = trained
        assert run.data.metrics
    assert_nothing_embedded(shared_cli)
