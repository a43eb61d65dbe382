"""What a killed stage left: which checkpoint a training resumes from, which shards a sampling keeps (no model)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from noisy_student_assets.core.resumable import (
    SET_ASIDE_PREFIX,
    checkpoint_gaps,
    latest_whole_checkpoint,
    resume_point,
    whole_parquet,
)
from noisy_student_assets.core.sampling import GENERATION_SCHEMA, SampleShards

WHOLE = {
    "adapter_model.safetensors": b"weights",
    "adapter_config.json": b"{}",
    "optimizer.pt": b"moments",
    "scheduler.pt": b"schedule",
    "rng_state.pth": b"rng",
    "training_args.bin": b"args",
    "trainer_state.json": json.dumps({"global_step": 2}).encode(),
}


def checkpoint(work_dir: Path, step: int, **changed: bytes | None) -> Path:
    """`checkpoint-<step>` with the files of a whole LoRA checkpoint, each of `changed` replaced (None: left out)."""
    directory = work_dir / f"checkpoint-{step}"
    directory.mkdir(parents=True)
    for name, data in (WHOLE | {name.replace("__", "."): data for name, data in changed.items()}).items():
        if data is not None:
            (directory / name).write_bytes(data)
    return directory


def test_a_whole_checkpoint_has_no_gaps(tmp_path: Path):
    assert checkpoint_gaps(checkpoint(tmp_path, 1)) == []
    full_model = checkpoint(tmp_path, 2, adapter_model__safetensors=None, model__safetensors=b"weights")
    assert checkpoint_gaps(full_model) == []


@pytest.mark.parametrize(
    ("changed", "gaps"),
    [
        ({"trainer_state__json": None}, ["no trainer_state.json"]),
        ({"trainer_state__json": b'{"global_st'}, ["trainer_state.json is cut short"]),
        ({"optimizer__pt": b"", "trainer_state__json": None}, ["no optimizer.pt", "no trainer_state.json"]),
        ({"scheduler__pt": None}, ["no scheduler.pt"]),
        ({"adapter_model__safetensors": b""}, ["no weights"]),
    ],
)
def test_a_checkpoint_cut_short_says_what_it_lacks(tmp_path: Path, changed: dict, gaps: list[str]):
    assert checkpoint_gaps(checkpoint(tmp_path, 3, **changed)) == gaps


def test_an_incomplete_newest_checkpoint_is_set_aside_and_the_whole_one_before_it_resumed(tmp_path: Path):
    """As a kill in TRL's save of step 3 leaves it: the weights written, the trainer state not yet."""
    whole = checkpoint(tmp_path, 2)
    checkpoint(tmp_path, 3, training_args__bin=b"", trainer_state__json=None, optimizer__pt=None)
    told: list[str] = []
    assert latest_whole_checkpoint(tmp_path) == whole
    assert resume_point(tmp_path, told.append) == whole
    (moved,) = [path.name for path in tmp_path.iterdir() if path.name.startswith(SET_ASIDE_PREFIX)]
    assert moved.startswith("incomplete-checkpoint-3-")
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["checkpoint-2", moved])
    assert told == [
        f"checkpoint-3 was incomplete (no optimizer.pt, no trainer_state.json; a run killed while saving it): set "
        f"aside as {moved}; resumed from checkpoint-2"
    ]
    assert resume_point(tmp_path, told.append) == whole and len(told) == 1, "a second look moves nothing"


def test_a_checkpoint_another_rank_moved_aside_first_leaves_the_same_resume_point(tmp_path: Path, monkeypatch):
    """Every rank of a torchrun training looks for its resume point at once: the one that loses the rename race
    resumes from the same checkpoint, and leaves the telling to the one that moved it."""
    from noisy_student_assets.core import resumable

    whole = checkpoint(tmp_path, 2)
    checkpoint(tmp_path, 3, trainer_state__json=None)

    def moved_by_another_rank(path: Path) -> Path:
        resumable.os.replace(path, tmp_path / f"{SET_ASIDE_PREFIX}{path.name}-by-rank-0")
        raise FileNotFoundError(path)

    monkeypatch.setattr(resumable, "move_aside", moved_by_another_rank)
    told: list[str] = []
    assert resume_point(tmp_path, told.append) == whole and told == []


def test_steps_order_by_number_and_with_no_whole_checkpoint_training_starts_over(tmp_path: Path):
    checkpoint(tmp_path, 9)
    checkpoint(tmp_path, 10)
    assert resume_point(tmp_path) == tmp_path / "checkpoint-10"
    empty = tmp_path / "other"
    assert resume_point(empty) is None
    checkpoint(empty, 1, trainer_state__json=None)
    told: list[str] = []
    assert resume_point(empty, told.append) is None
    assert told[0].endswith("no whole checkpoint: training starts over")
    assert not list(empty.glob("checkpoint-*"))


def shard(*problem_ids: str) -> pl.DataFrame:
    rows = [{"problem_id": pid, "sample_index": 0} for pid in problem_ids]
    return (
        pl.DataFrame(rows)
        .with_columns(pl.col("sample_index").cast(pl.Int32))
        .match_to_schema(GENERATION_SCHEMA, missing_columns="insert")
    )


def test_a_table_cut_short_or_of_other_columns_is_set_aside(tmp_path: Path):
    path = tmp_path / "shard-00000.parquet"
    shard("a", "b").write_parquet(path)
    assert whole_parquet(path, GENERATION_SCHEMA).equals(shard("a", "b"))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    told: list[str] = []
    assert whole_parquet(path, GENERATION_SCHEMA, told.append) is None
    assert not path.exists() and len(list(tmp_path.glob(f"{SET_ASIDE_PREFIX}shard-00000.parquet-*"))) == 1
    assert told[0].startswith(f"shard-00000.parquet in {tmp_path} is not a whole table (")
    pl.DataFrame({"problem_id": ["a"]}).write_parquet(path)
    assert whole_parquet(path, GENERATION_SCHEMA, told.append) is None and "columns" in told[1]


def test_sample_shards_skip_a_shard_cut_short_and_never_write_over_a_kept_one(tmp_path: Path):
    told: list[str] = []
    shards = SampleShards(tmp_path, told.append)
    for problems in (["a", "b"], ["c", "d"], ["e"]):
        shards.write(shard(*problems))
    middle = tmp_path / "shard-00001.parquet"
    middle.write_bytes(middle.read_bytes()[:100])
    assert shards.load()["problem_id"].to_list() == ["a", "b", "e"]
    assert len(told) == 1 and told[0].startswith("shard-00001.parquet in ")
    shards.write(shard("c", "d"))  # the problems of the shard set aside, sampled again
    assert sorted(path.name for path in tmp_path.glob("shard-*")) == [
        "shard-00000.parquet",
        "shard-00002.parquet",
        "shard-00003.parquet",
    ]
    assert shards.load()["problem_id"].to_list() == ["a", "b", "e", "c", "d"]
