"""The data lake: where every artifact lives, and how it gets there without ever being seen half-written."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import polars as pl
import psutil
from pydantic import Field

from noisy_student_assets.core import layout

STAGING_DIR_NAME = ".staging"
WORK_DIR_NAME = ".work"
INDEX_DIR_NAME = ".index"
CONTENT_KEY_FILE = "content_key.txt"
"""In an artifact that may be reused: a sha256 of everything that shaped it (see `DataLake.recall`)."""


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
    """Root directory of all artifacts: `<root>/<asset key path>/<arm>/`, or `<root>/<asset key path>/` for
    the assets every arm shares (see `noisy_student_assets.core.layout`)."""

    root: str = Field(
        default=str(layout.default_lake_root()),
        description="where the artifacts live (NOISY_STUDENT_DATA_LAKE; default ./data_lake)",
    )

    @property
    def root_path(self) -> Path:
        return Path(self.root).expanduser().resolve()

    def artifact_dir(self, asset_key: dg.AssetKey, partition_key: str | None = None) -> Path:
        return layout.artifact_dir(self.root_path, tuple(asset_key.path), partition_key)

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

    def work_dir(self, asset_key: dg.AssetKey, partition_key: str | None, run_key: str) -> Path:
        """Where a stage keeps resumable state (TRL checkpoints, sample shards) until it publishes.

        `run_key` must change with anything that shapes the run, so a retry resumes only its own run."""
        return self.root_path.joinpath(WORK_DIR_NAME, *asset_key.path, partition_key or "all", run_key)

    def publish(self, staged: Path, asset_key: dg.AssetKey, partition_key: str | None = None) -> Path:
        """Move a staged directory into the artifact's place; returns that place. A staged artifact that
        carries a content key is indexed under it, so that an identical computation elsewhere can reuse it."""
        final = self.artifact_dir(asset_key, partition_key)
        publish_dir(staged, final)
        if (final / CONTENT_KEY_FILE).exists():
            place = str(final.relative_to(self.root_path))
            entries = self.root_path / INDEX_DIR_NAME / (final / CONTENT_KEY_FILE).read_text()
            entries.mkdir(parents=True, exist_ok=True)
            (entries / hashlib.sha256(place.encode()).hexdigest()[:16]).write_text(place)
        return final

    def recall(self, content_key: str) -> Path | None:
        """A published artifact made from exactly the inputs `content_key` stands for (by any asset or arm),
        or None. Each candidate's own key file is read back, so one replaced since it was indexed is skipped."""
        entries = self.root_path / INDEX_DIR_NAME / content_key
        for entry in sorted(entries.iterdir()) if entries.is_dir() else []:
            found = self.root_path / entry.read_text()
            key_file = found / CONTENT_KEY_FILE
            if key_file.exists() and key_file.read_text() == content_key:
                return found
        return None

    def stage_copy(self, artifact: Path) -> Path:
        """A staged copy of a published artifact, by hard links: published files are never written in place
        (a new version is a new directory), so sharing them is safe and costs no space."""
        staged = self.staging_dir()
        shutil.copytree(artifact, staged, copy_function=os.link, dirs_exist_ok=True)
        return staged

    def read_sidecars(self, asset_key: dg.AssetKey, partition_key: str | None) -> dict[str, str]:
        """The small text files published beside a table (see `write_table`), by name."""
        directory = self.artifact_dir(asset_key, partition_key)
        return {
            path.name: path.read_text() for path in sorted(directory.iterdir()) if path.name != layout.TABLE_FILE_NAME
        }

    def write_table(
        self,
        frame: pl.DataFrame,
        asset_key: dg.AssetKey,
        partition_key: str | None = None,
        extra_files: dict[str, str] | None = None,
    ) -> Path:
        """Publish `frame` as `<artifact dir>/data.parquet`, with small text files beside it."""
        staged = self.staging_dir()
        frame.write_parquet(staged / layout.TABLE_FILE_NAME)
        for name, text in (extra_files or {}).items():
            (staged / name).write_text(text)
        return self.publish(staged, asset_key, partition_key) / layout.TABLE_FILE_NAME

    def has_table(self, asset_key: dg.AssetKey, partition_key: str | None = None) -> bool:
        return (self.artifact_dir(asset_key, partition_key) / layout.TABLE_FILE_NAME).exists()

    def read_table(self, asset_key: dg.AssetKey, partition_key: str | None = None) -> pl.DataFrame:
        path = self.artifact_dir(asset_key, partition_key) / layout.TABLE_FILE_NAME
        if not path.exists():
            where = f" arm {partition_key}" if partition_key else ""
            raise FileNotFoundError(f"{asset_key.to_user_string()}{where} has no table at {path}: materialize it first")
        return pl.read_parquet(path)

    def read_lake_table(self, asset_key: dg.AssetKey, partition_key: str | None = None) -> LakeTable:
        """A table with the small text files published beside it."""
        return LakeTable(self.read_table(asset_key, partition_key), self.read_sidecars(asset_key, partition_key))


@dataclass(frozen=True)
class LakeTable:
    """A table to publish with small text files beside it (audit figures, a content key)."""

    frame: pl.DataFrame
    extra_files: dict[str, str] = field(default_factory=dict)


def _writer_alive(staging_name: str) -> bool:
    """Whether the process a staging directory is named after (`<pid>-<hex>`) still runs."""
    pid = staging_name.split("-", 1)[0]
    return pid.isdigit() and psutil.pid_exists(int(pid))
