"""Materializing into a data lake of a test's own, in this process (tiny model, tiny settings)."""

from __future__ import annotations

import dagster as dg

from noisy_student_assets.definitions import ASSETS_AND_CHECKS
from resources import lake_resources
from resources.compute import ComputeResource
from resources.data_lake import DataLake

TEACHER_INPUTS = ["labeled_problems", "unlabeled_problems", "eval_problems", "base_model", "labeled_rl_checkpoint"]
"""What a round's op reads (its eval aside)."""


def materialize(lake: DataLake, selection: list[str], config: dict, partition: str | None = None) -> dg.ExecuteInJobResult:
    resources = lake_resources(lake, ComputeResource(device="cpu", dtype="float32"))
    result = dg.materialize(ASSETS_AND_CHECKS, selection=selection, resources=resources, run_config=config, partition_key=partition)
    assert result.success
    return result


def metadata_of(result: dg.ExecuteInJobResult, asset: str) -> dict:
    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == asset]
    return event.step_materialization_data.materialization.metadata
