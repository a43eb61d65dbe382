"""IO managers: polars tables as parquet, checkpoints as directories; both published atomically."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import polars as pl

from resources.data_lake import DataLake, publish_dir

TABLE_FILE_NAME = "data.parquet"


def _partition_key(context: dg.OutputContext | dg.InputContext) -> str | None:
    return context.partition_key if context.has_partition_key else None


def _upstream_dir(lake: DataLake, context: dg.InputContext) -> Path:
    return lake.artifact_dir(context.asset_key, _partition_key(context))


class ParquetIOManager(dg.ConfigurableIOManager):
    """Stores a `polars.DataFrame` at `<lake>/<asset>/<partition>/data.parquet`."""

    lake: DataLake

    def handle_output(self, context: dg.OutputContext, obj: pl.DataFrame) -> None:
        final = self.lake.artifact_dir(context.asset_key, _partition_key(context))
        staged = self.lake.staging_dir()
        obj.write_parquet(staged / TABLE_FILE_NAME)
        publish_dir(staged, final)
        context.add_output_metadata(
            {"path": dg.MetadataValue.path(str(final / TABLE_FILE_NAME)), "dagster/row_count": obj.height}
        )

    def load_input(self, context: dg.InputContext) -> pl.DataFrame:
        path = _upstream_dir(self.lake, context) / TABLE_FILE_NAME
        if not path.exists():
            raise FileNotFoundError(f"{context.asset_key.to_user_string()} has no table at {path}: materialize it first")
        return pl.read_parquet(path)


class CheckpointIOManager(dg.ConfigurableIOManager):
    """Moves a checkpoint directory (a `Path` the asset wrote under `DataLake.staging_dir()`) into
    `<lake>/<asset>/<partition>/`; downstream assets receive that directory's `Path`, never weights."""

    lake: DataLake

    def handle_output(self, context: dg.OutputContext, obj: Path) -> None:
        final = self.lake.artifact_dir(context.asset_key, _partition_key(context))
        publish_dir(Path(obj), final)
        context.add_output_metadata({"path": dg.MetadataValue.path(str(final))})

    def load_input(self, context: dg.InputContext) -> Path:
        path = _upstream_dir(self.lake, context)
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"{context.asset_key.to_user_string()} has no checkpoint at {path}: materialize it first"
            )
        return path
