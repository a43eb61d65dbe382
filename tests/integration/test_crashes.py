"""SIGKILL in the middle of writing generations, of sampling, of saving a checkpoint and of training
(tests/killed_run.py stops a real materialization there), then the same materialization again.

A killed writer never publishes a partial artifact (the previous version stays readable), the re-run
resumes what the killed one finished, and afterwards no partial file is left in the lake. An interrupt
(Ctrl-C, SIGTERM) in a heavy step stops the run there, without the retry a failure gets."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import dagster as dg
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.checkpoints import weights_sha256
from noisy_student_assets.core.sampling import GENERATION_SCHEMA, SampleShards
from noisy_student_assets.defs.assets.stages import PROBLEMS_FILE
from resources.data_lake import STAGING_DIR_NAME, WORK_DIR_NAME, DataLake
from tests.killed_run import ARM, TRAINING_STEPS, TRL_SAVE_FAULT, materialization
from tests.killed_run import kill_at as kill_at_fault
from tests.lakes import arms_instance, materialize, metadata_of
from tests.tiny_configs import op, round_names, tiny_config

GENERATIONS = dg.AssetKey(layout.round_asset(1, layout.GENERATIONS))
GENERATIONS_NAME = "/".join(GENERATIONS.path)
LABELED_RL = dg.AssetKey(layout.LABELED_RL)


@pytest.fixture
def lake(lake_copy) -> DataLake:
    return lake_copy()


@pytest.fixture
def kill_at(tiny_model_dir):
    return lambda fault, lake: kill_at_fault(fault, lake, tiny_model_dir)


@pytest.fixture
def rerun(tiny_model_dir):
    def run(fault: str, lake: DataLake) -> dg.ExecuteInJobResult:
        selection, config, arm = materialization(fault, str(tiny_model_dir))
        return materialize(lake, selection, config, arm)

    return run


def staged_files(lake: DataLake) -> list[Path]:
    return [p for p in (lake.root_path / STAGING_DIR_NAME).rglob("*") if p.is_file()]


def assert_nothing_partial_left(lake: DataLake) -> None:
    assert staged_files(lake) == [], "staging directories of the killed writer are deleted"
    assert not [p for p in lake.root_path.rglob("*.tmp")], "no temporary file remains"
    assert not [p for p in lake.root_path.rglob(".*.retired-*")]
    work = lake.root_path / WORK_DIR_NAME
    assert not [p for p in work.rglob("*") if p.is_file()], "resumable state is deleted once the artifact is published"


def test_killed_while_writing_generations(lake: DataLake, kill_at, rerun) -> None:
    kill_at("generations-write", lake)
    assert [p.name for p in staged_files(lake)].count("data.parquet") == 1, "the kill came mid-write"
    assert not lake.artifact_dir(GENERATIONS, ARM).exists(), "a partial table is never published"

    result = rerun("generations-write", lake)
    generations = lake.read_table(GENERATIONS, ARM)
    assert generations.schema == GENERATION_SCHEMA and generations.height == 6 * 3
    assert metadata_of(result, GENERATIONS_NAME)["samples"].value == 6 * 3
    assert_nothing_partial_left(lake)


def test_killed_while_sampling_resumes_from_the_saved_shards(lake: DataLake, kill_at, rerun) -> None:
    kill_at("sampling", lake)
    shards = list(lake.root_path.joinpath(WORK_DIR_NAME, *GENERATIONS.path, ARM).glob("*/*"))
    assert sorted(p.name for p in shards) == ["in-flight.parquet.tmp", PROBLEMS_FILE, "shard-00000.parquet"]

    result = rerun("sampling", lake)
    assert metadata_of(result, GENERATIONS_NAME)["resumed_problems"].value == 2  # one shard of 2 problems
    generations = lake.read_table(GENERATIONS, ARM)
    assert generations.schema == GENERATION_SCHEMA
    assert generations.group_by("problem_id").len()["len"].to_list() == [3] * 6
    assert_nothing_partial_left(lake)


def test_killed_while_saving_a_checkpoint(lake: DataLake, kill_at, rerun) -> None:
    published = lake.artifact_dir(LABELED_RL, ARM)
    before = weights_sha256(published)
    kill_at("checkpoint-save", lake)
    assert "model.safetensors" in [p.name for p in staged_files(lake)], "the kill came mid-save"
    assert weights_sha256(published) == before, "readers still see the previous, whole checkpoint"

    result = rerun("checkpoint-save", lake)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(published, use_safetensors=True)  # complete and loadable
    assert metadata_of(result, layout.LABELED_RL)["weights_sha256"].value == weights_sha256(published)
    assert_nothing_partial_left(lake)


def test_killed_while_training_resumes_from_the_last_trl_checkpoint(lake: DataLake, kill_at, rerun) -> None:
    kill_at("training", lake)
    saved = [p.name for p in (lake.root_path / WORK_DIR_NAME / layout.LABELED_RL).glob("*/*/checkpoint-*")]
    assert saved == ["checkpoint-1"]

    metadata = metadata_of(rerun("training", lake), layout.LABELED_RL)
    assert metadata["resumed_from_step"].value == 1.0
    assert metadata["steps"].value == float(TRAINING_STEPS)
    assert_nothing_partial_left(lake)


def test_killed_while_saving_a_trl_checkpoint_resumes_from_the_whole_one_before(lake: DataLake, tiny_model_dir) -> None:
    """Before, every later attempt resumed from the newest checkpoint-N, the one cut short, and failed on it."""
    kill_at_fault(TRL_SAVE_FAULT, lake, tiny_model_dir)
    (run_dir,) = lake.root_path.joinpath(WORK_DIR_NAME, layout.LABELED_RL).glob("*/*")
    assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert not (run_dir / "checkpoint-2" / "trainer_state.json").exists(), "the kill came mid-save"

    with arms_instance() as instance:
        result = materialize(lake, *materialization(TRL_SAVE_FAULT, str(tiny_model_dir)), instance=instance)
        warnings = [entry.user_message for entry in instance.all_logs(result.run_id) if entry.level == logging.WARNING]
    metadata = metadata_of(result, layout.LABELED_RL)
    assert metadata["resumed_from_step"].value == 1.0 and metadata["steps"].value == float(TRAINING_STEPS)
    (set_aside,) = metadata["set_aside"].value
    assert set_aside.startswith(
        "checkpoint-2 was incomplete (no scheduler.pt, no trainer_state.json; a run killed while"
    )
    assert set_aside.endswith("resumed from checkpoint-1")
    assert [message for message in warnings if set_aside in message], "the stage's log names what it set aside"
    assert_nothing_partial_left(lake)


@pytest.mark.parametrize("mode", ["sft", "dpo"])
def test_a_student_killed_while_training_in_a_mode_resumes(mode: str, sevens_lake_copy, sevens_model_dir: Path) -> None:
    lake, fault = sevens_lake_copy(), f"training-{mode}"
    kill_at_fault(fault, lake, sevens_model_dir)
    student = dg.AssetKey(layout.round_asset(1, layout.STUDENT))
    saved = [p.name for p in lake.root_path.joinpath(WORK_DIR_NAME, *student.path).glob("*/*/checkpoint-*")]
    assert saved == ["checkpoint-1"]
    assert not lake.artifact_dir(student, ARM).exists()

    selection, config, arm = materialization(fault, str(sevens_model_dir))
    result = materialize(lake, selection, config, arm)
    metadata = metadata_of(result, student.to_user_string())
    assert metadata["training_mode"].value == mode
    assert metadata["resumed_from_step"].value == 1.0 and metadata["steps"].value == float(TRAINING_STEPS)
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations() if c.asset_key == student}
    assert checks and all(checks.values()), checks  # finite weights, loads, generates
    assert_nothing_partial_left(lake)


@pytest.mark.parametrize("cleanup_fails", [False, True], ids=["plain", "cleanup-raising"])
def test_an_interrupt_while_sampling_stops_the_run_there_without_a_retry(
    lake: DataLake, tiny_model_dir: Path, monkeypatch, cleanup_fails: bool
) -> None:
    """SIGINT in the second shard of round 1's sampling; the labeled-only control, which does not read the samples,
    is the next step in the plan. The step fails as interrupted, is not retried, and no step starts after it; also
    where a library's cleanup raises an ordinary error as the interrupt unwinds it (MLflow's SQLAlchemy session did,
    and the retry trained the stage over)."""
    write_shard = SampleShards.write

    def interrupt_in_second_shard(shards, table):
        if list(shards.directory.glob("shard-*.parquet")):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler raises here, at the next bytecode
            finally:
                if cleanup_fails:
                    raise RuntimeError("Cannot operate on a closed database.")
        write_shard(shards, table)

    monkeypatch.setattr(SampleShards, "write", interrupt_in_second_shard)
    control = layout.control_checkpoint(layout.LABELED_ONLY)
    selection = round_names(1, layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT, control)
    result = materialize(lake, selection, tiny_config(tiny_model_dir), ARM, raise_on_error=False)

    generations = op(*layout.round_asset(1, layout.GENERATIONS))
    (failure,) = [event for event in result.all_events if event.is_step_failure]
    assert (
        failure.step_key == generations
        and failure.step_failure_data.error.cls_name == "DagsterExecutionInterruptedError"
    )
    assert not [event for event in result.all_events if event.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    started = [event.step_key for event in result.all_events if event.is_step_start]
    assert started[-1] == generations and op(*layout.round_asset(1, control)) not in started, started
    assert not lake.artifact_dir(GENERATIONS, ARM).exists(), "nothing was published"
