"""The grid command (`make grid`): killed mid-way, then run again, it resumes where it stopped; `--rounds`
stops every arm after a round, and a run without it adds the rest; SIGTERM stops it mid-step; the label sources'
grid reports every source, and `--through` stops an arm at its labels (tiny model)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import load_experiments
from noisy_student_assets.core.experiments.progress import arm_assets
from noisy_student_assets.core.pseudo_labels.frontier import ORACLE
from noisy_student_assets.core.pseudo_labels.labels import SOURCES_FILE
from noisy_student_assets.core.reporting.eval_report import metadata_key
from noisy_student_assets.core.reporting.round_report import FLIPS_TABLE, SOURCES_TABLE
from noisy_student_assets.defs.checks import FINITE_WEIGHTS, SMOKE_GENERATION
from resources.compute import DEVICE_POOL
from tests.cli import DagsterCli, changed_defaults_env
from tests.tiny_configs import TINY_GRPO, TINY_SAMPLING, op, round_names, tiny_config, with_op_config

pytestmark = pytest.mark.e2e

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "grid.yaml"
ARM = "g"


def _materializing(log: Path) -> str:
    (line,) = [line for line in log.read_text().splitlines() if line.startswith(f"[grid] arm {ARM}: materializing")]
    return line


def _enter_home(dagster_cli: DagsterCli, monkeypatch) -> None:
    monkeypatch.chdir(dagster_cli.home)  # dagster.yaml's storage paths are relative to the working directory
    with dg.DagsterInstance.from_config(str(dagster_cli.home)):
        pass  # its SQLite storage is created here, not by a test and the grid at once (a race of two schema migrations)


def _labeled_rl_checks_unjudged(instance: dg.DagsterInstance) -> list[str]:
    """Labeled RL's checks (steps of their own) whose latest evaluation did not pass on its latest materialization."""
    (materialization,) = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(layout.LABELED_RL), asset_partitions=[ARM]), limit=1
    ).records
    checks = [dg.AssetCheckKey(dg.AssetKey(layout.LABELED_RL), name) for name in (FINITE_WEIGHTS, SMOKE_GENERATION)]
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(checks, partition_filter=PartitionKeyFilter(key=ARM))
    unjudged = []
    for check in checks:
        record = latest.get(check)
        evaluation = record.event.dagster_event.event_specific_data if record and record.status == AssetCheckExecutionRecordStatus.SUCCEEDED else None
        if evaluation is None or evaluation.target_materialization_data.storage_id != materialization.storage_id:
            unjudged.append(check.name)
    return unjudged


def test_a_killed_grid_resumes_where_it_stopped(dagster_cli: DagsterCli, tiny_model_dir, tmp_path, monkeypatch) -> None:
    # Labeled RL's smoke check completes long answers (the random model runs every one to its limit), so that it is
    # still running when the kill lands, however fast the machine: the resumed grid must then evaluate it alone.
    slow_smoke = {"prompts": 4, "max_new_tokens": 768, "max_empty_rate": 1.0, "max_truncation_rate": 1.0}
    config = with_op_config(tiny_config(tiny_model_dir, rounds=1), f"{layout.LABELED_RL}_{SMOKE_GENERATION}", **slow_smoke)
    _enter_home(dagster_cli, monkeypatch)
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
        unjudged = _labeled_rl_checks_unjudged(instance)  # the kill came right after the materialization: its checks' steps were next
    assert SMOKE_GENERATION in unjudged, "the kill must land before the slow smoke check has judged labeled RL"

    second = dagster_cli.grid(EXPERIMENT, config, tmp_path / "second.log", "--rounds", "0")
    assert dagster_cli.finish(second, tmp_path / "second.log", 900) == 0, (tmp_path / "second.log").read_text()[-3000:]
    resumed = _materializing(tmp_path / "second.log")
    assert f" {layout.LABELED_RL}," not in resumed, "labeled RL is not trained again"
    assert layout.LABELED_RL_EVAL in resumed and layout.round_prefix(1) not in resumed, "--rounds 0 stops before round 1"
    assert "[grid] shared: up to date" in (tmp_path / "second.log").read_text()
    with dg.DagsterInstance.from_config(str(dagster_cli.home)) as instance:
        assert _labeled_rl_checks_unjudged(instance) == [], "the resumed grid ran the checks the kill left unevaluated"
    checked = [line for line in (tmp_path / "second.log").read_text().splitlines() if "evaluating checks" in line]
    assert all(f"{layout.LABELED_RL}:{name}" in "".join(checked) for name in unjudged), checked

    rest = dagster_cli.grid(EXPERIMENT, config, tmp_path / "rest.log")
    assert dagster_cli.finish(rest, tmp_path / "rest.log", 900) == 0, (tmp_path / "rest.log").read_text()[-3000:]
    added = _materializing(tmp_path / "rest.log")
    assert "round_001/eval_report" in added and layout.LABELED_RL not in added, "without --rounds the run adds round 1 only"
    assert (layout.artifact_dir(dagster_cli.lake, layout.round_asset(1, layout.EVAL_REPORT), ARM) / "report.md").is_file()

    with dg.DagsterInstance.from_config(str(dagster_cli.home)) as instance:
        runs = instance.get_run_records(dg.RunsFilter(tags={"noisy_student/experiment": "grid"}))
        statuses = sorted(r.dagster_run.status.value for r in runs)
        labeled_rl_events = instance.fetch_materializations(labeled_rl, limit=5).records
        device_pool = instance.event_log_storage.get_concurrency_info(DEVICE_POOL)
    assert "FAILURE" in statuses, "the killed grid's run is marked failed, not left started"
    assert "STARTED" not in statuses and len(labeled_rl_events) == 1
    assert not device_pool.claimed_slots and not device_pool.pending_steps, "the killed run's device pool slot was freed"

    def grid_run(*options: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "noisy_student_assets.grid", "run", str(EXPERIMENT), "--config-json", json.dumps(config), *options]
        return subprocess.run(command, cwd=dagster_cli.home, env=dagster_cli.env, capture_output=True, text=True, timeout=600)

    third = grid_run("--arm", ARM)
    assert third.returncode == 0 and f"[grid] arm {ARM}: up to date" in third.stdout
    unknown = grid_run("--arm", "nope")
    assert unknown.returncode == 1 and f"grid has no arm nope; its arms: {ARM}" in unknown.stderr

    checks = subprocess.run(
        [sys.executable, "-m", "noisy_student_assets.grid", "checks", str(EXPERIMENT)],
        cwd=dagster_cli.home, env=dagster_cli.env, capture_output=True, text=True, timeout=300,
    )
    assert checks.returncode == 0, checks.stderr[-3000:]
    student = "/".join(layout.round_asset(1, layout.STUDENT))
    for asset, name in ((layout.LABELED_RL, FINITE_WEIGHTS), (student, FINITE_WEIGHTS), (student, SMOKE_GENERATION)):
        assert f"| {ARM} | {asset} | {name} | passed |" in checks.stdout, checks.stdout
    report = "/".join(layout.round_asset(1, layout.EVAL_REPORT))
    assert f"| {ARM} | {report} | eval_not_degenerate | passed |" in checks.stdout, checks.stdout  # a check inside its asset


def test_sigterm_stops_the_grid_mid_step_without_a_retry_or_the_next_run(dagster_cli: DagsterCli, tiny_model_dir, tmp_path, monkeypatch) -> None:
    """Dagster turns the signal into the step's failure: a Dagster retry policy would start the stage over, and
    the grid, seeing only a failed run, would go on to the next."""
    endless = TINY_GRPO | {"max_steps": 100_000}
    config = with_op_config(tiny_config(tiny_model_dir, rounds=1), layout.LABELED_RL, grpo=endless)
    _enter_home(dagster_cli, monkeypatch)
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
        runs = [r.dagster_run for r in instance.get_run_records(dg.RunsFilter(tags={"noisy_student/experiment": "grid"}))]
        (arm_run,) = [run for run in runs if run.tags.get("dagster/partition") == ARM]
        events = [record.event_log_entry.dagster_event for record in instance.get_records_for_run(arm_run.run_id).records]
        device_pool = instance.event_log_storage.get_concurrency_info(DEVICE_POOL)
    events = [event for event in events if event is not None]
    assert arm_run.status == dg.DagsterRunStatus.FAILURE
    assert not [e for e in events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY], "an interrupt is not retried"
    (failure,) = [e for e in events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert failure.step_key == layout.LABELED_RL and failure.step_failure_data.error.cls_name == "DagsterExecutionInterruptedError"
    assert not device_pool.claimed_slots, "the interrupted step's device pool slot was freed"


def _grid_done(dagster_cli: DagsterCli, config: dict, log: Path, *options: str, env: dict | None = None, experiment: Path = EXPERIMENT) -> str:
    """Run the grid to its end; its output."""
    grid = dagster_cli.grid(experiment, config, log, *options, env=env)
    assert dagster_cli.finish(grid, log, 900) == 0, log.read_text()[-3000:]
    return log.read_text()


def test_the_grid_redoes_exactly_what_a_changed_default_changes_and_another_profile_reuses_nothing(
    dagster_cli: DagsterCli, tiny_model_dir, tmp_path, monkeypatch
) -> None:
    sampling_op = op(layout.round_prefix(1), layout.GENERATIONS)
    config = tiny_config(tiny_model_dir, rounds=1)
    config = {"ops": config["ops"] | {sampling_op: {"config": {k: v for k, v in TINY_SAMPLING.items() if k != "k"}}}}  # K from its default
    _enter_home(dagster_cli, monkeypatch)
    _grid_done(dagster_cli, config, tmp_path / "first.log")

    fewer_samples = changed_defaults_env({"TeacherSamplingSettings": {"k": 6}})
    text = _grid_done(dagster_cli, config, tmp_path / "k6.log", env=fewer_samples)
    redone = _materializing(tmp_path / "k6.log").split("materializing ", 1)[1].split(", ")
    assert "[grid] shared: up to date" in text
    assert set(redone) == set(round_names(1, layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT, layout.EVAL_REPORT)), text[-3000:]
    assert f"[grid] arm {ARM}: round_001/generations: settings changed: config.k: 8 -> 6" in text
    with dg.DagsterInstance.from_config(str(dagster_cli.home)) as instance:
        (latest,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(layout.round_asset(1, layout.GENERATIONS)), asset_partitions=[ARM]), limit=1
        ).records
    assert latest.asset_materialization.metadata["config"].value["k"] == 6

    again = _grid_done(dagster_cli, config, tmp_path / "again.log", env=fewer_samples)
    assert "[grid] shared: up to date" in again and f"[grid] arm {ARM}: up to date" in again, "an unchanged re-run materializes nothing"

    plan = subprocess.run(
        [sys.executable, "-m", "noisy_student_assets.grid", "plan", str(EXPERIMENT), "--config-json", json.dumps(config)],
        cwd=dagster_cli.home, env=dagster_cli.env | fewer_samples | {"NOISY_STUDENT_PROFILE": "gpu"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "up to date" not in plan.stdout, plan.stdout
    planned = {line.split(": ")[1] for line in plan.stdout.splitlines() if line.startswith(f"[grid] arm {ARM}: ")}
    experiment = load_experiments(EXPERIMENT.parent)[EXPERIMENT.stem]
    assert planned == set(arm_assets(experiment, experiment.arm(ARM))), plan.stdout
    assert f'[grid] shared: {layout.PROBLEM_POOL}: settings changed: profile: "cpu" -> "gpu"' in plan.stdout, plan.stdout


def test_an_arm_with_patience_1_stops_after_the_first_round_whose_validation_accuracy_did_not_improve(
    dagster_cli: DagsterCli, tiny_model_dir, tmp_path, monkeypatch
) -> None:
    """The grid applies the stopping rule the next-round automation applies (`progress.stop_reason`), on the
    validation accuracy its own runs recorded: tests/experiments/patience.yaml's arm cannot improve, so round 2 never runs."""
    patience, arm = EXPERIMENT.parent / "patience.yaml", "patient-grid"
    config = tiny_config(tiny_model_dir, rounds=2)
    _enter_home(dagster_cli, monkeypatch)
    text = _grid_done(dagster_cli, config, tmp_path / "grid.log", experiment=patience)
    assert f"[grid] arm {arm}: stopped after round 1: patience=1: validation accuracy did not improve on round 0's" in text, text[-3000:]
    with dg.DagsterInstance.from_config(str(dagster_cli.home)) as instance:
        made = {
            name: instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(name.split("/")), asset_partitions=[arm]), limit=1).records
            for name in (layout.LABELED_RL_VALIDATION, *round_names(1, layout.STUDENT_VALIDATION), *round_names(2, layout.GENERATIONS))
        }
    assert made[layout.LABELED_RL_VALIDATION] and made[round_names(1, layout.STUDENT_VALIDATION)[0]], "what the rule read"
    assert not made[round_names(2, layout.GENERATIONS)[0]], "round 2 never ran"

    plan = subprocess.run(
        [sys.executable, "-m", "noisy_student_assets.grid", "plan", str(patience), "--config-json", json.dumps(config)],
        cwd=dagster_cli.home, env=dagster_cli.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert plan.returncode == 0 and f"[grid] arm {arm}: up to date" in plan.stdout, "the plan knows the arm stopped: " + plan.stdout


def _sevens_problems(path: Path, count: int, first: int) -> Path:
    """A JSONL problem file whose every answer is 7 (the sevens model's), so that its samples are right and wrong on
    the same problem: what the verifier learns from."""
    path.write_text("".join(json.dumps({"question": f"What is {n} - {n - 7}?", "answer": "7"}) + "\n" for n in range(first, first + count)))
    return path


def test_the_label_sources_grid_reports_every_source_s_frontier_the_verifier_s_auroc_and_the_flips(
    dagster_cli: DagsterCli, sevens_model_dir, tmp_path, monkeypatch
) -> None:
    """tests/experiments/label_sources.yaml, the three sources on one teacher, through the grid CLI: every check passes,
    and each arm's round report draws the frontier of every source it can judge beside the oracle, with the flips."""
    experiment = EXPERIMENT.parent / "label_sources.yaml"
    config = tiny_config(sevens_model_dir, rounds=1, tau=0.5)
    pool, held_out = _sevens_problems(tmp_path / "pool.jsonl", 40, 10), _sevens_problems(tmp_path / "eval.jsonl", 5, 100)
    config["ops"] |= {
        layout.PROBLEM_POOL: {"config": {"source": {"kind": "file", "path": str(pool)}}},
        layout.EVAL_PROBLEMS: {"config": {"source": {"kind": "file", "path": str(held_out)}}},
    }
    _enter_home(dagster_cli, monkeypatch)
    labels = "/".join(layout.round_asset(1, layout.PSEUDO_LABELS))
    through = _grid_done(dagster_cli, config, tmp_path / "labels.log", "--arm", "ls-verifier", "--through", labels, experiment=experiment)
    (first,) = [line for line in through.splitlines() if line.startswith("[grid] arm ls-verifier: materializing")]
    assert first.endswith(f"round_001/verifier, round_001/verifier_scores, {labels}"), "the labels and what they read, no student"
    assert "ls-majority" not in through and "materializing verdict" not in through
    sidecar = pl.read_json(layout.artifact_dir(dagster_cli.lake, layout.round_asset(1, layout.PSEUDO_LABELS), "ls-verifier") / SOURCES_FILE)
    assert set(sidecar["source"]) == {"majority", "confidence", "verifier", ORACLE}, "the direct effect, without the students"
    rest = _grid_done(dagster_cli, config, tmp_path / "grid.log", experiment=experiment)
    (then,) = [line for line in rest.splitlines() if line.startswith("[grid] arm ls-verifier: materializing")]
    assert "round_001/verifier" not in then and "round_001/student_checkpoint" in then, "the rest, not the labels again"

    checks = subprocess.run(
        [sys.executable, "-m", "noisy_student_assets.grid", "checks", str(experiment)],
        cwd=dagster_cli.home, env=dagster_cli.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert checks.returncode == 0, checks.stderr[-3000:]
    outcomes = [line for line in checks.stdout.splitlines() if line.startswith("| ls-")]
    assert outcomes and all(line.rstrip().endswith("| passed |") for line in outcomes), checks.stdout
    assert "| ls-verifier | round_001/verifier | verifier_informative | passed |" in checks.stdout, checks.stdout

    sources = {"ls-majority": {"majority", "confidence"}, "ls-confidence": {"majority", "confidence"}}
    sources["ls-verifier"] = {"majority", "confidence", "verifier"}
    for arm, judged in sources.items():
        report = layout.artifact_dir(dagster_cli.lake, layout.round_asset(1, layout.EVAL_REPORT), arm)
        assert (report / "label_frontier.png").is_file(), arm
        table = pl.read_parquet(report / f"{metadata_key(SOURCES_TABLE)}.parquet")
        assert set(table["source"]) == judged | {ORACLE}, arm
        flips = pl.read_parquet(report / f"{metadata_key(FLIPS_TABLE)}.parquet").row(0, named=True)
        assert flips["eval_set"] == "all" and flips["problems"] == 5, arm
        audit = pl.read_parquet(report / f"{metadata_key('Pseudo-label audit')}.parquet").row(0, named=True)
        assert audit["label_source"] == arm.removeprefix("ls-")
    assert audit["verifier_validation_auroc"] is not None, "the verifier arm's report shows its validation AUROC"
