"""Materialize the data assets and `base_model` in-process, against a temporary data lake."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import polars as pl
from safetensors.torch import load_file
from transformers import AutoTokenizer

from noisy_student_assets.assets.models import base_model
from noisy_student_assets.assets.problems import eval_problems, problem_split
from noisy_student_assets.checkpoints import weights_sha256
from noisy_student_assets.problems import HIDDEN_GOLD_COLUMN, PROBLEM_SCHEMA
from resources import lake_resources
from resources.data_lake import DataLake


def _resources(root: Path) -> dict:
    return lake_resources(DataLake(root=str(root)))


def test_data_assets_and_base_model_materialize(lake_root: Path, tiny_model_dir: Path) -> None:
    run_config = {
        "ops": {
            "problem_split": {"config": {"n_labeled": 16, "n_unlabeled": 40, "seed": 3}},
            "eval_problems": {"config": {"source": {"kind": "reasoning_gym", "name": "basic_arithmetic", "size": 50, "seed": 7}}},
            "base_model": {"config": {"reference": str(tiny_model_dir)}},
        }
    }
    result = dg.materialize(
        [problem_split, eval_problems, base_model], resources=_resources(lake_root), run_config=run_config
    )
    assert result.success

    labeled = pl.read_parquet(lake_root / "labeled_problems" / "data.parquet")
    unlabeled = pl.read_parquet(lake_root / "unlabeled_problems" / "data.parquet")
    held_out = pl.read_parquet(lake_root / "eval_problems" / "data.parquet")
    assert (labeled.height, unlabeled.height) == (16, 40)
    assert labeled.schema == PROBLEM_SCHEMA and held_out.schema == PROBLEM_SCHEMA
    assert "gold_answer" not in unlabeled.columns and HIDDEN_GOLD_COLUMN in unlabeled.columns
    assert set(labeled["problem_id"]).isdisjoint(unlabeled["problem_id"])
    training_prompts = set(labeled["prompt"]) | set(unlabeled["prompt"])
    assert 0 < held_out.height <= 50 and training_prompts.isdisjoint(held_out["prompt"])

    checkpoint = lake_root / "base_model"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "config.json").is_file()
    assert "quantization_config" not in json.loads((checkpoint / "config.json").read_text())
    assert AutoTokenizer.from_pretrained(checkpoint).chat_template
    assert load_file(checkpoint / "model.safetensors")
    assert not any((lake_root / ".staging").iterdir()), "staging must be empty once artifacts are published"

    by_asset = {
        event.asset_key.to_user_string(): event.step_materialization_data.materialization.metadata
        for event in result.get_asset_materialization_events()
    }
    assert by_asset["labeled_problems"]["dagster/row_count"].value == 16
    assert "preview" in by_asset["unlabeled_problems"] and "fingerprint" in by_asset["eval_problems"]
    assert HIDDEN_GOLD_COLUMN not in by_asset["unlabeled_problems"]["preview"].value
    assert by_asset["base_model"]["weights_sha256"].value == weights_sha256(checkpoint)
    assert by_asset["base_model"]["n_parameters"].value > 0


def test_rematerializing_replaces_the_artifact(lake_root: Path) -> None:
    config = {"ops": {"problem_split": {"config": {"n_labeled": 8, "n_unlabeled": 8, "seed": 0}}}}
    resources = _resources(lake_root)
    assert dg.materialize([problem_split], resources=resources, run_config=config).success
    first = pl.read_parquet(lake_root / "labeled_problems" / "data.parquet")
    config["ops"]["problem_split"]["config"]["seed"] = 1
    assert dg.materialize([problem_split], resources=resources, run_config=config).success
    second = pl.read_parquet(lake_root / "labeled_problems" / "data.parquet")
    assert first["problem_id"].to_list() != second["problem_id"].to_list()
    assert sorted(p.name for p in (lake_root / "labeled_problems").iterdir()) == ["data.parquet"]
