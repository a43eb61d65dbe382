"""Rounds through the CLI and the daemon: a partition materialized with `dagster asset materialize`, and
a backfill of rounds 1-2 that the daemon runs in order (tiny model, tiny settings)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from resources.compute import DEVICE_LOCK_ACQUIRED, DEVICE_LOCK_RELEASED
from tests.cli import DAGSTER_DAEMON, DagsterCli
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


@pytest.fixture(scope="module")
def foundation_home(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir) -> Path:
    """A project directory (instance and lake) whose foundation the CLI materialized once for this module."""
    cli = DagsterCli(tmp_path_factory.mktemp("foundation"))
    cli("asset", "materialize", *MODULE, "--select", FOUNDATION, "--config-json", json.dumps(foundation_config(tiny_model_dir)))
    return cli.home


@pytest.fixture
def foundation(foundation_home: Path, tmp_path: Path) -> DagsterCli:
    """A copy of `foundation_home` of the test's own, so that no test sees another's runs or rounds."""
    home = tmp_path / "project"
    shutil.copytree(foundation_home, home)
    return DagsterCli(home)


def _round_args(round_key: str, config: dict) -> list[str]:
    return ["asset", "materialize", *MODULE, "--select", ",".join(ROUND_SELECTION), "--partition", round_key, "--config-json", json.dumps(config)]


def _device_lock_intervals(instance: dg.DagsterInstance, run_ids: list[str]) -> list[tuple[float, float, str]]:
    """(acquired, released, run id) of every hold of the device lock by the given runs."""
    intervals = []
    for run_id in run_ids:
        acquired = [e.timestamp for e in instance.all_logs(run_id) if DEVICE_LOCK_ACQUIRED in e.message]
        released = [e.timestamp for e in instance.all_logs(run_id) if DEVICE_LOCK_RELEASED in e.message]
        assert len(acquired) == len(released) >= 2
        intervals += [(start, end, run_id) for start, end in zip(acquired, released, strict=True)]
    return sorted(intervals)


def test_rounds_through_cli_one_then_two_at_once(foundation, tmp_path, monkeypatch) -> None:
    result = foundation(*_round_args("round-001", round_config()))
    assert "RUN_SUCCESS" in result.stdout + result.stderr
    lake = foundation.lake
    assert _teacher_of(lake, "round-001") == {str(lake / "labeled_rl_checkpoint")}
    assert (lake / "student_checkpoint" / "round-001" / "model.safetensors").is_file()
    assert (lake / "eval_report" / "round-001" / "report.md").is_file()

    # Round 1 again with another tau while round 2 runs, as two users would: the heavy work takes turns
    # on the device and each round's data stays whole.
    runs = {key: foundation.start(*_round_args(key, round_config(tau)), log=tmp_path / f"{key}.log")
            for key, tau in (("round-001", 0.5), ("round-002", 0.0))}
    for key, process in runs.items():
        assert process.wait(timeout=900) == 0, (tmp_path / f"{key}.log").read_text()[-4000:]
    monkeypatch.chdir(foundation.home)  # dagster.yaml's storage paths are relative to the working directory
    with dg.DagsterInstance.from_config(str(foundation.home)) as instance:
        concurrent = [r.dagster_run.run_id for r in instance.get_run_records(limit=2)]
        intervals = _device_lock_intervals(instance, concurrent)
    for (_, end, run), (start, _, next_run) in zip(intervals, intervals[1:]):
        assert run == next_run or start >= end, "two runs used the device at once"
    for key in ("round-001", "round-002"):
        assert pl.read_parquet(lake / "generations" / key / "data.parquet").height == 6 * 3
        assert (lake / "eval_report" / key / "report.md").is_file()
    assert not [p for p in (lake / ".staging").rglob("*") if p.is_file()]


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
