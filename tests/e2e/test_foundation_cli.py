"""The foundation's acceptance commands, through the real CLI and the real SmolLM2 weights."""

from __future__ import annotations

import json

import polars as pl
import pytest

from noisy_student_assets.problems import HIDDEN_GOLD_COLUMN

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_validate_and_materialize_foundation_assets(dagster_cli) -> None:
    dagster_cli("definitions", "validate", "-w", "workspace.yaml")
    result = dagster_cli(
        "asset", "materialize", "-m", "noisy_student_assets.definitions",
        "--select", "labeled_problems,unlabeled_problems,eval_problems,base_model",
    )
    assert "RUN_SUCCESS" in result.stdout + result.stderr

    lake = dagster_cli.lake
    assert pl.read_parquet(lake / "labeled_problems" / "data.parquet").height > 0
    assert HIDDEN_GOLD_COLUMN in pl.read_parquet(lake / "unlabeled_problems" / "data.parquet").columns
    assert pl.read_parquet(lake / "eval_problems" / "data.parquet").height > 0
    config = json.loads((lake / "base_model" / "config.json").read_text())
    assert config["num_hidden_layers"] == 30 and "quantization_config" not in config  # SmolLM2-135M, de-quantised
    assert (lake / "base_model" / "model.safetensors").stat().st_size > 500e6  # float32 weights
    assert (dagster_cli.home / "data_lake" / ".dagster" / "storage").is_dir(), "the instance in dagster.yaml was used"
