"""IO managers: polars tables as parquet, checkpoints and evaluations as directories; all published atomically.
What an asset reads of another asset comes through one of these, as a declared input."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import polars as pl

from noisy_student_assets.core.reporting.eval_report import PublishedEval, read_published_eval
from resources.data_lake import DataLake, LakeTable


def _partition_key(context: dg.OutputContext | dg.InputContext) -> str | None:
    # The asset's own partition: an unpartitioned input of a partitioned asset has none.
    return context.asset_partition_key if context.has_asset_partitions else None


class ParquetIOManager(dg.ConfigurableIOManager):
    """Stores a `polars.DataFrame` (or a `LakeTable`, with files beside it) at
    `<lake>/<asset>/<partition>/data.parquet`; an input typed `LakeTable` gets the files beside it too."""

    lake: DataLake

    def handle_output(self, context: dg.OutputContext, obj: pl.DataFrame | LakeTable) -> None:
        table = obj if isinstance(obj, LakeTable) else LakeTable(obj)
        path = self.lake.write_table(table.frame, context.asset_key, _partition_key(context), table.extra_files)
        context.add_output_metadata({"path": dg.MetadataValue.path(str(path)), "dagster/row_count": table.frame.height})

    def load_input(self, context: dg.InputContext) -> pl.DataFrame | LakeTable:
        partition = _partition_key(context)
        if context.dagster_type.typing_type is LakeTable:
            return self.lake.read_lake_table(context.asset_key, partition)
        return self.lake.read_table(context.asset_key, partition)


class DirectoryIOManager(dg.ConfigurableIOManager):
    """Moves a directory the asset wrote under `DataLake.staging_dir()` into `<lake>/<asset>/<partition>/`;
    downstream assets receive the published directory's `Path`."""

    lake: DataLake

    def handle_output(self, context: dg.OutputContext, obj: Path) -> None:
        final = self.lake.publish(Path(obj), context.asset_key, _partition_key(context))
        context.add_output_metadata({"path": dg.MetadataValue.path(str(final))})

    def load_input(self, context: dg.InputContext) -> Path:
        return self.lake.artifact_dir(context.asset_key, _partition_key(context))


class CheckpointIOManager(DirectoryIOManager):
    """Checkpoints as directories: downstream assets receive the published directory's `Path`, never weights."""

    def load_input(self, context: dg.InputContext) -> Path:
        path = self.lake.artifact_dir(context.asset_key, _partition_key(context))
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"{context.asset_key.to_user_string()} has no checkpoint at {path}: materialize it first"
            )
        return path


class EvalIOManager(DirectoryIOManager):
    """Evaluations as directories (`core.reporting.eval_report`): downstream assets receive a `PublishedEval`, or None
    where the evaluation was never materialized (an asset that needs it says so)."""

    def load_input(self, context: dg.InputContext) -> PublishedEval | None:
        return read_published_eval(self.lake.artifact_dir(context.asset_key, _partition_key(context)))
