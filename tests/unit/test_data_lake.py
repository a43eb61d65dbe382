"""The data lake's staging and publishing: what a killed writer leaves is cleaned up, a live writer's is not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import polars as pl

from resources.data_lake import STAGING_DIR_NAME, DataLake, publish_dir


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_staging_deletes_the_directories_of_dead_writers_only(tmp_path: Path) -> None:
    staging = tmp_path / STAGING_DIR_NAME
    dead = staging / f"{dead_pid()}-0123"
    live = staging / f"{os.getppid()}-4567"  # another process that still runs: a concurrent writer
    unnamed = staging / "no-pid"
    for directory in (dead, live, unnamed):
        directory.mkdir(parents=True)
        (directory / "data.parquet").write_bytes(b"PAR1 half")
    fresh = DataLake(root=str(tmp_path)).staging_dir()
    assert fresh.name.startswith(f"{os.getpid()}-")
    assert sorted(p.name for p in staging.iterdir()) == sorted([live.name, fresh.name])


def test_publish_replaces_a_whole_directory_and_clears_leftovers_of_a_killed_publish(tmp_path: Path) -> None:
    lake = DataLake(root=str(tmp_path))
    key = dg.AssetKey("table")
    lake.write_table(pl.DataFrame({"x": [1]}), key)
    final = lake.artifact_dir(key)
    leftover = final.with_name(f".{final.name}.retired-deadbeef")  # killed between its two renames
    leftover.mkdir()
    lake.write_table(pl.DataFrame({"x": [2]}), key)
    assert lake.read_table(key)["x"].to_list() == [2]
    assert sorted(p.name for p in final.parent.iterdir()) == [STAGING_DIR_NAME, "table"]
    assert list((tmp_path / STAGING_DIR_NAME).iterdir()) == []


def test_publish_dir_moves_into_a_new_place(tmp_path: Path) -> None:
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "f").write_text("whole")
    publish_dir(staged, tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b" / "f").read_text() == "whole" and not staged.exists()


def test_an_artifact_is_recalled_by_its_content_key_until_it_is_replaced(tmp_path: Path) -> None:
    from resources.data_lake import CONTENT_KEY_FILE, LakeTable

    lake = DataLake(root=str(tmp_path))
    first, second = dg.AssetKey(["round_001", "generations"]), dg.AssetKey(["round_002", "generations"])
    assert lake.recall("k1") is None
    lake.write_table(pl.DataFrame({"x": [1]}), first, "arm-a", {CONTENT_KEY_FILE: "k1"})
    lake.write_table(pl.DataFrame({"x": [1]}), second, "arm-b", {CONTENT_KEY_FILE: "k1"})
    assert lake.recall("k1") in (lake.artifact_dir(first, "arm-a"), lake.artifact_dir(second, "arm-b"))
    lake.write_table(pl.DataFrame({"x": [2]}), first, "arm-a", {CONTENT_KEY_FILE: "k2"})  # replaced: no longer k1
    assert lake.recall("k1") == lake.artifact_dir(second, "arm-b") and lake.recall("k2") == lake.artifact_dir(
        first, "arm-a"
    )
    assert LakeTable(pl.DataFrame()).extra_files == {}


def test_a_staged_copy_shares_the_files_and_leaves_the_original_whole(tmp_path: Path) -> None:
    lake = DataLake(root=str(tmp_path))
    original = tmp_path / "checkpoint"
    original.mkdir()
    (original / "model.safetensors").write_bytes(b"weights")
    staged = lake.stage_copy(original)
    assert (staged / "model.safetensors").stat().st_ino == (original / "model.safetensors").stat().st_ino
    lake.publish(staged, dg.AssetKey("copy"), "arm")
    assert (original / "model.safetensors").read_bytes() == b"weights"
