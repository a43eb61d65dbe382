"""SIGKILL in the middle of writing generations, of sampling, of saving a checkpoint and of training
(tests/killed_run.py stops a real materialization there), then the same materialization again.

A killed writer never publishes a partial artifact (the previous version stays readable), the re-run
resumes what the killed one finished, and afterwards no partial file is left in the lake."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from noisy_student_assets import layout
from noisy_student_assets.checkpoints import weights_sha256
from noisy_student_assets.generation import GENERATION_SCHEMA
from resources.data_lake import STAGING_DIR_NAME, WORK_DIR_NAME, DataLake
from tests.killed_run import ARM, TRAINING_STEPS, materialization
from tests.lakes import materialize, metadata_of

REPO = Path(__file__).resolve().parents[2]
GENERATIONS = dg.AssetKey(layout.round_asset(1, layout.GENERATIONS))
GENERATIONS_NAME = "/".join(GENERATIONS.path)
LABELED_RL = dg.AssetKey(layout.LABELED_RL)
FAULT_TIMEOUT_S = 600


@pytest.fixture
def lake(lake_copy) -> DataLake:
    return lake_copy()


@pytest.fixture
def kill_at(tiny_model_dir):
    return lambda fault, lake: _kill_at(fault, lake, tiny_model_dir)


@pytest.fixture
def rerun(tiny_model_dir):
    def run(fault: str, lake: DataLake) -> dg.ExecuteInJobResult:
        selection, config, arm = materialization(fault, str(tiny_model_dir))
        return materialize(lake, selection, config, arm)

    return run


def _kill_at(fault: str, lake: DataLake, model_dir: Path) -> None:
    """Run tests/killed_run.py until it reaches `fault`, then SIGKILL its whole process group."""
    ready = lake.root_path.parent / f"{fault}.ready"
    log = lake.root_path.parent / f"{fault}.log"
    with log.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.killed_run", fault, lake.root, str(ready), str(model_dir)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + FAULT_TIMEOUT_S
        while not ready.exists():
            assert child.poll() is None, f"exited {child.returncode} before its fault:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"did not reach its fault in {FAULT_TIMEOUT_S} s"
            time.sleep(0.2)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL


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
    assert sorted(p.name for p in shards) == ["in-flight.parquet.tmp", "shard-00000.parquet"]

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

