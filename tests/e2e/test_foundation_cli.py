"""The foundation's acceptance commands, through the real CLI and the real SmolLM2 weights."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN
from tests.cli import own_device_lock

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TEST_EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "tests.yaml"


def test_validate_and_materialize_foundation_assets(dagster_cli) -> None:
    """The problem tables, their split and SmolLM2 as the base model, and `base_model_eval` on it with the
    transformers backend (a base model's tokenizer, not a trained one's), with every check at its default: one run."""
    dagster_cli.env |= own_device_lock(dagster_cli)  # its long SmolLM2 steps must not hold up another file's runs
    dagster_cli("definitions", "validate", "-w", "workspace.yaml")
    eval_source = {"kind": "reasoning_gym", "name": "basic_arithmetic", "size": 12, "seed": 1000}
    config = {
        "ops": {
            "eval_problems": {"config": {"source": eval_source}},
            "base_model_eval": {"config": {"backend": "transformers", "samples": 0, "ks": []}},
        }
    }
    registered = dagster_cli.run_grid("register", TEST_EXPERIMENT)
    assert registered.returncode == 0, registered.stderr[-3000:]
    result = dagster_cli(
        "asset",
        "materialize",
        "-m",
        "noisy_student_assets.definitions",
        "--select",
        "problem_pool,eval_problems,base_model,base_model_eval,labeled_problems,unlabeled_problems,validation_problems",
        "--partition",
        "a",
        "--config-json",
        json.dumps(config),
    )
    output = result.stdout + result.stderr
    assert "RUN_SUCCESS" in output

    lake = dagster_cli.lake
    assert pl.read_parquet(lake / "labeled_problems" / "a" / "data.parquet").height == 64  # the cpu profile's split
    assert HIDDEN_GOLD_COLUMN in pl.read_parquet(lake / "unlabeled_problems" / "a" / "data.parquet").columns
    assert pl.read_parquet(lake / "validation_problems" / "a" / "data.parquet").height == 200
    assert pl.read_parquet(lake / "eval_problems" / "a" / "data.parquet").height == 12
    config = json.loads((lake / "base_model" / "a" / "config.json").read_text())
    assert config["num_hidden_layers"] == 30 and "quantization_config" not in config  # SmolLM2-135M, de-quantised
    assert (lake / "base_model" / "a" / "model.safetensors").stat().st_size > 500e6  # float32 weights
    assert (dagster_cli.home / "data_lake" / ".dagster" / "storage").is_dir(), "the instance in dagster.yaml was used"

    for check in ("finite_weights", "smoke_generation"):
        assert f"Asset check '{check}' on 'base_model' passed" in output
    assert "Asset check 'eval_not_degenerate' on 'base_model_eval' passed" in output
    report = json.loads((lake / "base_model_eval" / "a" / "metrics.json").read_text())
    assert report["metrics"]["problems"] == 12 and report["metrics"]["answer_rate"] > 0.5
