"""Materializing into a data lake of a test's own, in this process (tiny model, tiny settings)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from noisy_student_assets.defs.grid import evaluate_checks, materialize_selection
from noisy_student_assets.defs.partitions import ARMS
from resources import lake_resources
from resources.compute import ComputeResource
from resources.data_lake import DataLake
from resources.launchers import StageLauncher

TEST_ARMS = ("a", "b")
"""The arms of tests/experiments/tests.yaml."""


def isolated_resources(lake: DataLake, launcher: str | StageLauncher = "inprocess") -> dict:
    """The code location's resources on `lake`, on the CPU, with a device lock of the lake's own: a test must
    not queue behind (or block) a pipeline running on this machine. One thread per process: the tests' processes
    share the machine's cores, and a tiny model gains nothing from a second thread that would wait for a core."""
    compute = ComputeResource(device="cpu", dtype="float32", cpu_threads=1, lock_dir=str(lake.root_path))
    return lake_resources(
        lake, compute, launcher=launcher if isinstance(launcher, StageLauncher) else StageLauncher(kind=launcher)
    )


@contextmanager
def arms_instance() -> Iterator[dg.DagsterInstance]:
    """An ephemeral Dagster instance with the test arms registered."""
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(ARMS.name, list(TEST_ARMS))
        yield instance


def materialize(
    lake: DataLake,
    names: list[str],
    config: dict,
    arm: str | None = None,
    instance: dg.DagsterInstance | None = None,
    raise_on_error: bool = True,
    launcher: str | StageLauncher = "inprocess",
) -> dg.ExecuteInJobResult:
    """Materialize `names` of one arm (or the shared assets, arm None) into `lake`, the heavy stages run by
    `launcher`."""
    resources = isolated_resources(lake, launcher)

    def run(on: dg.DagsterInstance) -> dg.ExecuteInJobResult:
        return materialize_selection(
            names, partition=arm, instance=on, resources=resources, run_config=config, raise_on_error=raise_on_error
        )

    if instance is not None:
        result = run(instance)
    else:
        with arms_instance() as ephemeral:
            result = run(ephemeral)
    assert result.success or not raise_on_error
    return result


def metadata_of(result: dg.ExecuteInJobResult, asset: str) -> dict:
    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == asset]
    return event.step_materialization_data.materialization.metadata


def run_checks(lake: DataLake, asset: str, config: dict, arm: str) -> dg.ExecuteInJobResult:
    """Only the checks of one arm's asset, as the UI's *Execute checks* runs them."""
    from noisy_student_assets.definitions import defs

    checks = dg.AssetSelection.checks_for_assets(dg.AssetKey(asset.split("/"))).resolve_checks(
        defs.resolve_asset_graph()
    )
    with arms_instance() as instance:
        return evaluate_checks(
            checks, partition=arm, instance=instance, resources=isolated_resources(lake), run_config=config
        )


def answerable_by_sevens(lake: DataLake, arm: str) -> None:
    """Labeled and validation problems whose gold is "7", so that the teacher's samples (`sevens_model_dir`) are right
    ("7") and wrong (no answer, "77") on the same problem: the pairs a verifier learns from, and both classes of its
    AUROC."""
    import polars as pl

    from noisy_student_assets.core import layout

    for name in (layout.LABELED_PROBLEMS, layout.VALIDATION_PROBLEMS):
        key = dg.AssetKey(name)
        lake.write_table(lake.read_table(key, arm).with_columns(pl.lit("7").alias("gold_answer")), key, arm)
