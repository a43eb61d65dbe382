"""Rounds through the CLI and the daemon: a partition materialized with `dagster asset materialize`, and
a backfill of rounds 1-2 that the daemon runs in order (tiny model, tiny settings)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from tests.cli import DAGSTER_DAEMON
from tests.tiny_configs import ROUND_SELECTION, foundation_config, round_config

pytestmark = pytest.mark.e2e

MODULE = ["-m", "noisy_student_assets.definitions"]
FOUNDATION = "labeled_problems,unlabeled_problems,eval_problems,base_model,labeled_rl_checkpoint,base_model_eval,labeled_rl_eval"


def _failures(instance: dg.DagsterInstance, records) -> str:
    """The error messages of the backfill's failed runs, so a failing backfill says why."""
    messages = []
    for record in records:
        for event in instance.all_logs(record.dagster_run.run_id):
            if event.dagster_event and event.dagster_event.event_type in (
                dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE
            ):
                messages.append(f"{record.dagster_run.tags.get('dagster/partition')}: {event.message}")
    return "\n".join(messages)


def _teacher_of(lake: Path, round_key: str) -> set[str]:
    return {label.split(" sha256:")[0] for label in pl.read_parquet(lake / "generations" / round_key / "data.parquet")["checkpoint"]}


@pytest.fixture
def foundation(dagster_cli, tiny_model_dir):
    dagster_cli("asset", "materialize", *MODULE, "--select", FOUNDATION, "--config-json", json.dumps(foundation_config(tiny_model_dir)))
    return dagster_cli


def test_round_partition_through_cli(foundation) -> None:
    result = foundation(
        "asset", "materialize", *MODULE, "--select", ",".join(ROUND_SELECTION),
        "--partition", "round-001", "--config-json", json.dumps(round_config()),
    )
    assert "RUN_SUCCESS" in result.stdout + result.stderr
    lake = foundation.lake
    assert _teacher_of(lake, "round-001") == {str(lake / "labeled_rl_checkpoint")}
    assert (lake / "student_checkpoint" / "round-001" / "model.safetensors").is_file()
    assert (lake / "eval_report" / "round-001" / "report.md").is_file()


def test_backfill_runs_rounds_in_order(foundation, monkeypatch) -> None:
    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

    from noisy_student_assets.definitions import defs

    monkeypatch.chdir(foundation.home)  # dagster.yaml's storage paths are relative to the working directory
    with dg.DagsterInstance.from_config(str(foundation.home)) as instance:
        backfill = PartitionBackfill.from_asset_partitions(
            backfill_id="rounds12",
            asset_graph=defs.resolve_asset_graph(),
            partition_names=["round-001", "round-002"],
            asset_selection=[dg.AssetKey(key) for key in ROUND_SELECTION],
            backfill_timestamp=time.time(),
            tags={},
            dynamic_partitions_store=instance,
            all_partitions=False,
            title="rounds 1-2",
            description=None,
            run_config=round_config(),
        )
        instance.add_backfill(backfill)
        daemon_log = foundation.home / "daemon.log"
        daemon = subprocess.Popen(
            [DAGSTER_DAEMON, "run", *MODULE],
            cwd=foundation.home, env=foundation.env, stdout=daemon_log.open("w"), stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.time() + 900
            while instance.get_backfill("rounds12").status == BulkActionStatus.REQUESTED and time.time() < deadline:
                time.sleep(5)
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
        records = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": "rounds12"}))
        assert instance.get_backfill("rounds12").status == BulkActionStatus.COMPLETED_SUCCESS, (
            _failures(instance, records) or daemon_log.read_text()[-4000:]
        )
        round_runs = sorted(
            (r for r in records if dg.AssetKey("student_checkpoint") in r.dagster_run.asset_selection),
            key=lambda r: r.start_time,
        )
        assert [r.dagster_run.tags["dagster/partition"] for r in round_runs] == ["round-001", "round-002"]
        assert round_runs[1].start_time >= round_runs[0].end_time, "round 2 started before round 1 finished"
    lake = foundation.lake
    assert _teacher_of(lake, "round-002") == {str(lake / "student_checkpoint" / "round-001")}
