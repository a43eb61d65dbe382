"""The data lake: where every artifact lives, and how it gets there without ever being seen half-written."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import dagster as dg
import polars as pl
import psutil

STAGING_DIR_NAME = ".staging"
WORK_DIR_NAME = ".work"
TABLE_FILE_NAME = "data.parquet"


def default_root() -> str:
    """`NOISY_STUDENT_DATA_LAKE` (written to `.env` by `make setup`), else `./data_lake`."""
    return os.environ.get("NOISY_STUDENT_DATA_LAKE") or str(Path("data_lake").resolve())


def publish_dir(staged: Path, final: Path) -> None:
    """Move a fully written directory into place with renames only (atomic on one filesystem).

    A previous version is renamed aside first and deleted afterwards, so a reader sees the old
    directory, then (for an instant) none, then the new one, never a partial one.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    for leftover in final.parent.glob(f".{final.name}.retired-*"):  # of a publish killed between its renames
        shutil.rmtree(leftover, ignore_errors=True)
    retired = None
    if final.exists():
        retired = final.with_name(f".{final.name}.retired-{uuid.uuid4().hex[:8]}")
        os.replace(final, retired)
    os.replace(staged, final)
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)


class DataLake(dg.ConfigurableResource):
    """Root directory of all artifacts: `<root>/<asset>/<partition>/` (or `<root>/<asset>/` unpartitioned)."""

    root: str = default_root()

    @property
    def root_path(self) -> Path:
        return Path(self.root).expanduser().resolve()

    def artifact_dir(self, asset_key: dg.AssetKey, partition_key: str | None = None) -> Path:
        path = self.root_path.joinpath(*asset_key.path)
        return path / partition_key if partition_key else path

    def staging_dir(self) -> Path:
        """A fresh directory on the lake's filesystem, so publishing it is a rename, not a copy.

        It is named after this process; staging directories of processes that no longer run (killed
        mid-write) are deleted here, so a crash leaves no partial files behind for long.
        """
        staging = self.root_path / STAGING_DIR_NAME
        if staging.is_dir():
            for orphan in staging.iterdir():
                if not _writer_alive(orphan.name):
                    shutil.rmtree(orphan, ignore_errors=True)
        path = staging / f"{os.getpid()}-{uuid.uuid4().hex}"
        path.mkdir(parents=True)
        return path

    def work_dir(self, asset_name: str, partition_key: str | None, run_key: str) -> Path:
        """Where a stage keeps resumable state (TRL checkpoints, sample shards) until it publishes.

        `run_key` must change with anything that shapes the run, so a retry resumes only its own run."""
        return self.root_path / WORK_DIR_NAME / asset_name / (partition_key or "all") / run_key

    def publish(self, staged: Path, asset_key: dg.AssetKey, partition_key: str | None = None) -> Path:
        """Move a staged directory into the artifact's place; returns that place."""
        final = self.artifact_dir(asset_key, partition_key)
        publish_dir(staged, final)
        return final

    def write_table(
        self,
        frame: pl.DataFrame,
        asset_key: dg.AssetKey,
        partition_key: str | None = None,
        extra_files: dict[str, str] | None = None,
    ) -> Path:
        """Publish `frame` as `<artifact dir>/data.parquet`, with small text files beside it."""
        staged = self.staging_dir()
        frame.write_parquet(staged / TABLE_FILE_NAME)
        for name, text in (extra_files or {}).items():
            (staged / name).write_text(text)
        return self.publish(staged, asset_key, partition_key) / TABLE_FILE_NAME

    def read_table(self, asset_key: dg.AssetKey, partition_key: str | None = None) -> pl.DataFrame:
        path = self.artifact_dir(asset_key, partition_key) / TABLE_FILE_NAME
        if not path.exists():
            where = f" partition {partition_key}" if partition_key else ""
            raise FileNotFoundError(f"{asset_key.to_user_string()}{where} has no table at {path}: materialize it first")
        return pl.read_parquet(path)


def _writer_alive(staging_name: str) -> bool:
    """Whether the process a staging directory is named after (`<pid>-<hex>`) still runs."""
    pid = staging_name.split("-", 1)[0]
    return pid.isdigit() and psutil.pid_exists(int(pid))
