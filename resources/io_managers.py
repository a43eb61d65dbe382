"""IO managers: polars tables as parquet, checkpoints as directories; both published atomically."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import polars as pl

from resources.data_lake import DataLake, LakeTable


def _partition_key(context: dg.OutputContext | dg.InputContext) -> str | None:
    # The asset's own partition: an unpartitioned input of a partitioned asset has none.
    return context.asset_partition_key if context.has_asset_partitions else None


class ParquetIOManager(dg.ConfigurableIOManager):
    """Stores a `polars.DataFrame` (or a `LakeTable`, with files beside it) at
    `<lake>/<asset>/<partition>/data.parquet`."""

    lake: DataLake

    def handle_output(self, context: dg.OutputContext, obj: pl.DataFrame | LakeTable) -> None:
        table = obj if isinstance(obj, LakeTable) else LakeTable(obj)
        path = self.lake.write_table(table.frame, context.asset_key, _partition_key(context), table.extra_files)
        context.add_output_metadata({"path": dg.MetadataValue.path(str(path)), "dagster/row_count": table.frame.height})

    def load_input(self, context: dg.InputContext) -> pl.DataFrame:
        return self.lake.read_table(context.asset_key, _partition_key(context))


class CheckpointIOManager(dg.ConfigurableIOManager):
    """Moves a checkpoint directory (a `Path` the asset wrote under `DataLake.staging_dir()`) into
    `<lake>/<asset>/<partition>/`; downstream assets receive that directory's `Path`, never weights."""

    lake: DataLake

    def handle_output(self, context: dg.OutputContext, obj: Path) -> None:
        final = self.lake.publish(Path(obj), context.asset_key, _partition_key(context))
        context.add_output_metadata({"path": dg.MetadataValue.path(str(final))})

    def load_input(self, context: dg.InputContext) -> Path:
        path = self.lake.artifact_dir(context.asset_key, _partition_key(context))
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"{context.asset_key.to_user_string()} has no checkpoint at {path}: materialize it first"
            )
        return path
