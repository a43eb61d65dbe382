"""The grid command (`make grid`) stopped from outside: killed mid-way, then run again, it resumes where it stopped
(`--rounds` stops every arm after a round, and a run without it adds the rest); killed while TRL saves a checkpoint,
its next run sets the half-saved checkpoint aside and finishes; SIGTERM stops it mid-step, with no retry and no next
run (tiny model)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from noisy_student_assets.core import layout
from noisy_student_assets.defs.checks import FINITE_WEIGHTS, SMOKE_GENERATION
from resources.compute import DEVICE_POOL
from tests.cli import DagsterCli, materializing
from tests.faults import fault_environment
from tests.tiny_configs import TINY_GRPO, tiny_config, with_op_config

pytestmark = pytest.mark.e2e

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "grid.yaml"
ARM = "g"


def _labeled_rl_checks_unjudged(instance: dg.DagsterInstance) -> list[str]:
    """Labeled RL's checks (steps of their own) whose latest evaluation did not pass on its latest materialization."""
    (materialization,) = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(layout.LABELED_RL), asset_partitions=[ARM]), limit=1
    ).records
    checks = [dg.AssetCheckKey(dg.AssetKey(layout.LABELED_RL), name) for name in (FINITE_WEIGHTS, SMOKE_GENERATION)]
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        checks, partition_filter=PartitionKeyFilter(key=ARM)
    )
    unjudged = []
    for check in checks:
        record = latest.get(check)
        evaluation = (
            record.event.dagster_event.event_specific_data
            if record and record.status == AssetCheckExecutionRecordStatus.SUCCEEDED
            else None
        )
        if evaluation is None or evaluation.target_materialization_data.storage_id != materialization.storage_id:
            unjudged.append(check.name)
    return unjudged


def test_a_killed_grid_resumes_where_it_stopped(dagster_cli: DagsterCli, tiny_model_dir, tmp_path, monkeypatch) -> None:
    # Labeled RL's smoke check completes long answers (the random model runs every one to its limit), so that it is
    # still running when the kill lands, however fast the machine: the resumed grid must then evaluate it alone.
    slow_smoke = {"prompts": 4, "max_new_tokens": 768, "max_empty_rate": 1.0, "max_truncation_rate": 1.0}
    config = with_op_config(
        tiny_config(tiny_model_dir, rounds=1), f"{layout.LABELED_RL}_{SMOKE_GENERATION}", **slow_smoke
    )
    dagster_cli.enter(monkeypatch)
    first = dagster_cli.grid(EXPERIMENT, config, tmp_path / "first.log")
    labeled_rl = dg.AssetRecordsFilter(asset_key=dg.AssetKey(layout.LABELED_RL), asset_partitions=[ARM])
    deadline = time.monotonic() + 600
    with dg.DagsterInstance.from_config(str(dagster_cli.home)) as instance:
        while not instance.fetch_materializations(labeled_rl, limit=1).records:  # kill once labeled RL is recorded
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "labeled RL was not materialized in 10 minutes"
            time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    with dg.DagsterInstance.from_config(str(dagster_cli.home)) as instance:
        unjudged = _labeled_rl_checks_unjudged(
            instance
        )  # the kill came right after the materialization: its checks' steps were next
    assert SMOKE_GENERATION in unjudged, "the kill must land before the slow smoke check has judged labeled RL"

    second = dagster_cli.grid(EXPERIMENT, config, tmp_path / "second.log", "--rounds", "0")
    assert dagster_cli.finish(second, tmp_path / "second.log", 900) == 0, (tmp_path / "second.log").read_text()[-3000:]
    resumed = materializing(tmp_path / "second.log", ARM)
    assert f" {layout.LABELED_RL}," not in resumed, "labeled RL is not trained again"
    assert layout.LABELED_RL_EVAL in resumed and layout.round_prefix(1) not in resumed, (
        "--rounds 0 stops before round 1"
    )
    with dg.DagsterInstance.from_config(str(dagster_cli.home)) as instance:
        assert _labeled_rl_checks_unjudged(instance) == [], "the resumed grid ran the checks the kill left unevaluated"
    checked = [line for line in (tmp_path / "second.log").read_text().splitlines() if "evaluating checks" in line]
    assert all(f"{layout.LABELED_RL}:{name}" in "".join(checked) for name in unjudged), checked

    rest = dagster_cli.grid(EXPERIMENT, config, tmp_path / "rest.log")
    assert dagster_cli.finish(rest, tmp_path / "rest.log", 900) == 0, (tmp_path / "rest.log").read_text()[-3000:]
    added = materializing(tmp_path / "rest.log", ARM)
    assert "round_001/eval_report" in added and layout.LABELED_RL not in added, (
        "without --rounds the run adds round 1 only"
    )
    assert (
        layout.artifact_dir(dagster_cli.lake, layout.round_asset(1, layout.EVAL_REPORT), ARM) / "report.md"
    ).is_file()

    with dg.DagsterInstance.from_config(str(dagster_cli.home)) as instance:
        runs = instance.get_run_records(dg.RunsFilter(tags={"noisy_student/experiment": "grid"}))
        statuses = sorted(r.dagster_run.status.value for r in runs)
        labeled_rl_events = instance.fetch_materializations(labeled_rl, limit=5).records
        device_pool = instance.event_log_storage.get_concurrency_info(DEVICE_POOL)
    assert "FAILURE" in statuses, "the killed grid's run is marked failed, not left started"
    assert "STARTED" not in statuses and len(labeled_rl_events) == 1
    assert not device_pool.claimed_slots and not device_pool.pending_steps, (
        "the killed run's device pool slot was freed"
    )

    third = dagster_cli.run_grid("run", EXPERIMENT, config, "--arm", ARM)
    assert third.returncode == 0 and f"[grid] arm {ARM}: up to date" in third.stdout
    unknown = dagster_cli.run_grid("run", EXPERIMENT, config, "--arm", "nope")
    assert unknown.returncode == 1 and f"grid has no arm nope; its arms: {ARM}" in unknown.stderr

    checks = dagster_cli.run_grid("checks", EXPERIMENT)
    assert checks.returncode == 0, checks.stderr[-3000:]
    student = "/".join(layout.round_asset(1, layout.STUDENT))
    for asset, name in ((layout.LABELED_RL, FINITE_WEIGHTS), (student, FINITE_WEIGHTS), (student, SMOKE_GENERATION)):
        assert f"| {ARM} | {asset} | {name} | passed |" in checks.stdout, checks.stdout
    report = "/".join(layout.round_asset(1, layout.EVAL_REPORT))
    assert f"| {ARM} | {report} | eval_not_degenerate | passed |" in checks.stdout, (
        checks.stdout
    )  # a check inside its asset


def test_a_grid_killed_while_saving_a_checkpoint_sets_it_aside_and_finishes_on_its_next_run(
    dagster_cli: DagsterCli, tiny_model_dir, tmp_path, monkeypatch
) -> None:
    """Killed with its process group while TRL saves labeled RL's checkpoint-2 (`tests/payload_faults`), a grid left
    it without a trainer state, and every later run resumed from it and failed. Every process the grid started ends
    with the kill; the next run resumes from checkpoint-1 and its log names what it set aside."""
    grpo = TINY_GRPO | {"max_steps": 3, "save_steps": 1}
    config = with_op_config(tiny_config(tiny_model_dir, rounds=1), layout.LABELED_RL, grpo=grpo)
    dagster_cli.enter(monkeypatch)
    ready = tmp_path / "saving.ready"
    first_log = tmp_path / "first.log"
    first = dagster_cli.grid(
        EXPERIMENT, config, first_log, "--rounds", "0", env=fault_environment("hang-in-checkpoint-save", ready)
    )
    deadline = time.monotonic() + 600
    try:
        while not ready.exists():
            assert first.poll() is None, first_log.read_text()[-3000:]
            assert time.monotonic() < deadline, "labeled RL did not reach its second checkpoint in 10 minutes"
            time.sleep(0.5)
        started = psutil.Process(first.pid).children(recursive=True)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    _, alive = psutil.wait_procs(started, timeout=60)
    assert not alive, [process.cmdline() for process in alive]

    text = dagster_cli.grid_done(EXPERIMENT, config, tmp_path / "second.log", "--rounds", "0")
    (line,) = [line for line in text.splitlines() if "checkpoint-2 was incomplete" in line]
    assert "no trainer_state.json" in line and line.endswith("resumed from checkpoint-1"), line
    assert not list((dagster_cli.lake / ".work").rglob("incomplete-checkpoint-*")), "set aside until published"


def test_sigterm_stops_the_grid_mid_step_without_a_retry_or_the_next_run(
    dagster_cli: DagsterCli, tiny_model_dir, tmp_path, monkeypatch
) -> None:
    """Dagster turns the signal into the step's failure: a Dagster retry policy would start the stage over, and
    the grid, seeing only a failed run, would go on to the next."""
    endless = TINY_GRPO | {"max_steps": 100_000}
    config = with_op_config(tiny_config(tiny_model_dir, rounds=1), layout.LABELED_RL, grpo=endless)
    dagster_cli.enter(monkeypatch)
    log = tmp_path / "grid.log"
    grid = dagster_cli.grid(EXPERIMENT, config, log)
    training = re.compile(rf"{layout.LABELED_RL} - step \d+/100000")
    deadline = time.monotonic() + 600
    try:
        while not training.search(log.read_text()):
            assert grid.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "labeled RL did not start training in 10 minutes"
            time.sleep(0.5)
        os.kill(grid.pid, signal.SIGTERM)
        assert dagster_cli.finish(grid, log, 300) == 130, log.read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(grid.pid, signal.SIGKILL)  # a grid that did not stop would train on
    text = log.read_text()
    assert "[grid] stopped by an interrupt during run" in text and f"(arm {ARM})" in text, text[-3000:]
    assert f"materializing {layout.VERDICT}" not in text, "the grid did not go on to the next run"

    with dg.DagsterInstance.from_config(str(dagster_cli.home)) as instance:
        runs = [
            r.dagster_run for r in instance.get_run_records(dg.RunsFilter(tags={"noisy_student/experiment": "grid"}))
        ]
        (arm_run,) = [run for run in runs if run.tags.get("dagster/partition") == ARM]
        events = [
            record.event_log_entry.dagster_event for record in instance.get_records_for_run(arm_run.run_id).records
        ]
        device_pool = instance.event_log_storage.get_concurrency_info(DEVICE_POOL)
    events = [event for event in events if event is not None]
    assert arm_run.status == dg.DagsterRunStatus.FAILURE
    assert not [e for e in events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY], (
        "an interrupt is not retried"
    )
    (failure,) = [e for e in events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert (
        failure.step_key == layout.LABELED_RL
        and failure.step_failure_data.error.cls_name == "DagsterExecutionInterruptedError"
    )
    assert not device_pool.claimed_slots, "the interrupted step's device pool slot was freed"
