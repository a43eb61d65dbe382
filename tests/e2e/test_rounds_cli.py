"""Arms and rounds through the CLI and the daemon (tiny model, tiny settings): the arms registered by the grid
command, rounds materialized with `dagster asset materialize`, a re-label with a new tau, two runs at once,
and a daemon backfill of 2 rounds x 2 arms."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from itertools import pairwise
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.promotion import read_promotion
from noisy_student_assets.core.pseudo_labels.labels import PublishedAudit
from resources.compute import DEVICE_LOCK_ACQUIRED, DEVICE_LOCK_RELEASED
from tests.cli import DAGSTER_DAEMON, DagsterCli, run_failures
from tests.tiny_configs import FOUNDATION, round_chain, tiny_config

pytestmark = pytest.mark.e2e

MODULE = ["-m", "noisy_student_assets.definitions"]
TEST_EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "tests.yaml"
ARMS = ("a", "b")
ROUNDS = {number: round_chain(number, layout.LABELED_ONLY) for number in (1, 2)}


def _teacher_of(lake: Path, number: int, arm: str) -> set[str]:
    table = pl.read_parquet(
        layout.artifact_dir(lake, layout.round_asset(number, layout.GENERATIONS), arm) / "data.parquet"
    )
    return {label.split(" sha256:")[0] for label in table["checkpoint"]}


# Every step in the run's own process: the same ops, without a Python start and torch import per step (CI time).
# tests/e2e/test_foundation_cli.py runs the default, a process per step.
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}


def _materialize(cli: DagsterCli, names: list[str], config: dict, arm: str | None = None, select: str | None = None):
    partition = ["--partition", arm] if arm else []
    selection = select or ",".join(names)
    return [
        "asset",
        "materialize",
        *MODULE,
        "--select",
        selection,
        *partition,
        "--config-json",
        json.dumps(config | IN_PROCESS),
    ]


@pytest.fixture(scope="module")
def foundation_home(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir) -> Path:
    """A project directory (instance and lake) whose arms the grid command registered and whose per-arm foundation
    (task, base model, split, labeled RL and their evaluations) the CLI materialized, once for this module."""
    cli = DagsterCli(tmp_path_factory.mktemp("foundation"))
    cli.env |= _own_device_lock(tmp_path_factory)
    registered = cli.run_grid("register", TEST_EXPERIMENT)
    assert registered.returncode == 0, registered.stderr[-3000:]
    assert "tests: arms a, b, c (3 new)" in registered.stdout
    config = tiny_config(tiny_model_dir)
    for arm in ARMS:
        cli(
            *_materialize(
                cli,
                [
                    *FOUNDATION,
                    layout.BASE_MODEL_EVAL,
                    layout.UNLABELED_PROBLEMS,
                    layout.VALIDATION_PROBLEMS,
                    layout.LABELED_RL_EVAL,
                ],
                config,
                arm,
            )
        )
    return cli.home


@pytest.fixture
def foundation(foundation_home: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> DagsterCli:
    """A copy of `foundation_home` of the test's own, so that no test sees another's runs or rounds."""
    home = tmp_path / "project"
    shutil.copytree(foundation_home, home)
    cli = DagsterCli(home)
    cli.env |= _own_device_lock(tmp_path_factory)
    return cli


def _own_device_lock(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A device lock for this module's runs alone (`own_device_lock`, outside the homes the tests copy): another
    file's heavy steps (the SmolLM2 foundation's) must not make these runs wait."""
    directory = tmp_path_factory.getbasetemp() / "rounds_cli_device_lock"
    directory.mkdir(exist_ok=True)  # a TMPDIR that does not exist is passed over for /tmp
    return {"TMPDIR": str(directory)}


def _device_lock_intervals(instance: dg.DagsterInstance, run_ids: list[str]) -> list[tuple[float, float, str]]:
    """(acquired, released, run id) of every hold of the device lock by the given runs."""
    intervals = []
    for run_id in run_ids:
        acquired = [e.timestamp for e in instance.all_logs(run_id) if DEVICE_LOCK_ACQUIRED in e.message]
        released = [e.timestamp for e in instance.all_logs(run_id) if DEVICE_LOCK_RELEASED in e.message]
        assert len(acquired) == len(released) >= 2
        intervals += [(start, end, run_id) for start, end in zip(acquired, released, strict=True)]
    return sorted(intervals)


def test_rounds_through_cli_relabel_then_two_at_once(foundation, tmp_path, tiny_model_dir, monkeypatch) -> None:
    config = tiny_config(tiny_model_dir)
    result = foundation(*_materialize(foundation, ROUNDS[1], config, "a"))
    assert "RUN_SUCCESS" in result.stdout + result.stderr
    lake = foundation.lake
    assert _teacher_of(lake, 1, "a") == {str(lake / "labeled_rl_checkpoint" / "a")}
    assert (lake / "round_001" / "student_checkpoint" / "a" / "model.safetensors").is_file()
    assert (lake / "round_001" / "eval_report" / "a" / "report.md").is_file()

    # A new tau re-runs the vote and what reads it, never the sampling.
    relabel = foundation(
        *_materialize(foundation, [], tiny_config(tiny_model_dir, tau=0.9), "a", select="round_001/pseudo_labels+")
    )
    assert "RUN_SUCCESS" in relabel.stdout + relabel.stderr
    monkeypatch.chdir(foundation.home)  # dagster.yaml's storage paths are relative to the working directory
    with dg.DagsterInstance.from_config(str(foundation.home)) as instance:
        (latest,) = instance.get_run_records(limit=1)
        steps = {
            e.step_key
            for e in instance.all_logs(latest.dagster_run.run_id)
            if e.is_dagster_event and e.dagster_event.is_step_start
        }
        generations = dg.AssetKey(layout.round_asset(1, layout.GENERATIONS))
        sampled = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=generations, asset_partitions=["a"]), limit=10
        )
    assert {"round_001__pseudo_labels", "round_001__student_checkpoint", "round_001__eval_report"} <= steps
    assert "round_001__generations" not in steps, "the vote re-ran without sampling"
    assert len(sampled.records) == 1
    assert PublishedAudit.read(lake / "round_001" / "pseudo_labels" / "a").tau == 0.9

    # Arm a's round 2 while arm b's round 1 runs, as two users would: the heavy work takes turns on the
    # device and each arm's data stays whole.
    runs = {
        arm: foundation.start(*_materialize(foundation, ROUNDS[number], config, arm), log=tmp_path / f"{arm}.log")
        for arm, number in (("a", 2), ("b", 1))
    }
    for arm, process in runs.items():
        assert process.wait(timeout=900) == 0, (tmp_path / f"{arm}.log").read_text()[-4000:]
    with dg.DagsterInstance.from_config(str(foundation.home)) as instance:
        concurrent = [r.dagster_run.run_id for r in instance.get_run_records(limit=2)]
        intervals = _device_lock_intervals(instance, concurrent)
    for (_, end, run), (start, _, next_run) in pairwise(intervals):
        assert run == next_run or start >= end, "two runs used the device at once"
    for arm, number in (("a", 2), ("b", 1)):
        assert pl.read_parquet(lake / f"round_00{number}" / "generations" / arm / "data.parquet").height == 6 * 3
        assert (lake / f"round_00{number}" / "eval_report" / arm / "report.md").is_file()
    assert _teacher_of(lake, 2, "a") == {str(lake / "round_002" / "teacher" / "a")}
    assert (
        read_promotion(lake / "round_002" / "teacher" / "a").checkpoint
        == lake / "round_001" / "student_checkpoint" / "a"
    )
    assert not [p for p in (lake / ".staging").rglob("*") if p.is_file()]


def test_backfill_of_two_rounds_for_two_arms_through_the_daemon(foundation, tiny_model_dir, monkeypatch) -> None:
    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

    from noisy_student_assets.definitions import defs

    monkeypatch.chdir(foundation.home)  # dagster.yaml's storage paths are relative to the working directory
    selection = [dg.AssetKey(name.split("/")) for name in (*ROUNDS[1], *ROUNDS[2])]
    with dg.DagsterInstance.from_config(str(foundation.home)) as instance:
        backfill = PartitionBackfill.from_asset_partitions(
            backfill_id="arms_rounds",
            asset_graph=defs.resolve_asset_graph(),
            partition_names=list(ARMS),
            asset_selection=selection,
            backfill_timestamp=time.time(),
            tags={},
            dynamic_partitions_store=instance,
            all_partitions=False,
            title="2 rounds x 2 arms",
            description=None,
            run_config=tiny_config(tiny_model_dir) | IN_PROCESS,
        )
        instance.add_backfill(backfill)
        daemon_log = foundation.home / "daemon.log"
        daemon = subprocess.Popen(
            [DAGSTER_DAEMON, "run", *MODULE],
            cwd=foundation.home,
            env=foundation.env,
            stdout=daemon_log.open("w"),
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.time() + 900
            while instance.get_backfill("arms_rounds").status == BulkActionStatus.REQUESTED and time.time() < deadline:
                time.sleep(5)
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
        records = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": "arms_rounds"}))
        assert instance.get_backfill("arms_rounds").status == BulkActionStatus.COMPLETED_SUCCESS, (
            run_failures(instance, records) or daemon_log.read_text()[-4000:]
        )
        for arm in ARMS:
            (run,) = [r for r in records if r.dagster_run.tags["dagster/partition"] == arm]
            started = {
                e.step_key: e.timestamp
                for e in instance.all_logs(run.dagster_run.run_id)
                if e.is_dagster_event and e.dagster_event.is_step_start
            }
            finished = {
                e.step_key: e.timestamp
                for e in instance.all_logs(run.dagster_run.run_id)
                if e.is_dagster_event and e.dagster_event.is_step_success
            }
            assert (
                started["round_002__generations"]
                >= finished["round_002__teacher"]
                >= finished["round_001__student_validation"]
                >= finished["round_001__student_checkpoint"]
            ), "round 2 sampled before its teacher existed"
            assert started["round_002__labeled_only_checkpoint"] >= finished["round_001__labeled_only_checkpoint"]
    lake = foundation.lake
    for arm in ARMS:
        assert _teacher_of(lake, 1, arm) == {str(lake / "labeled_rl_checkpoint" / arm)}
        assert _teacher_of(lake, 2, arm) == {str(lake / "round_002" / "teacher" / arm)}
        assert read_promotion(lake / "round_002" / "teacher" / arm).checkpoint == (
            lake / "round_001" / "student_checkpoint" / arm
        ), "round 2's teacher is promoted from this arm's round-1 student"
        report = json.loads((lake / "round_002" / "eval_report" / arm / "metrics.json").read_text())
        assert report["checkpoint"] == str(lake / "round_002" / "student_checkpoint" / arm)
        labeled_only = json.loads((lake / "round_002" / "labeled_only_eval" / arm / "metrics.json").read_text())
        assert labeled_only["checkpoint"] == str(lake / "round_002" / "labeled_only_checkpoint" / arm)
