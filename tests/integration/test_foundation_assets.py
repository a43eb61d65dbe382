"""The problem tables and `base_model` materialized in-process against a temporary data lake: an arm's task and
model (a second arm of the same ones reads the converted model back), and its split of the pool."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import polars as pl
from safetensors.torch import load_file
from transformers import AutoTokenizer

from noisy_student_assets.core import layout
from noisy_student_assets.core.checkpoints import weights_sha256
from noisy_student_assets.core.experiments.tasks import load_tasks
from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN, PROBLEM_SCHEMA, load_problems
from noisy_student_assets.defs.grid import ARM_TAG, ROUND_TAG
from noisy_student_assets.defs.jobs import ARM_JOB
from resources.data_lake import DataLake
from tests.lakes import arms_instance, materialize
from tests.tiny_configs import TASK_AND_MODEL, TINY_SMOKE, TWO_DIGIT

SPLIT = [layout.LABELED_PROBLEMS, layout.UNLABELED_PROBLEMS, layout.VALIDATION_PROBLEMS]


def _config(tiny_model_dir: Path, seed: int = 3) -> dict:
    return {
        "ops": {
            layout.PROBLEM_POOL: {"config": {"source": TWO_DIGIT | {"size": 200, "seed": 0}}},
            layout.EVAL_PROBLEMS: {"config": {"source": TWO_DIGIT | {"size": 50, "seed": 1000}}},
            "problem_split": {"config": {"n_labeled": 16, "n_unlabeled": 40, "n_validation": 20, "seed": seed}},
            layout.BASE_MODEL: {"config": {"reference": str(tiny_model_dir)}},
            f"{layout.BASE_MODEL}_smoke_generation": {"config": TINY_SMOKE},
        }
    }


def _metadata(*results: dg.ExecuteInJobResult) -> dict[str, dict]:
    return {
        event.asset_key.to_user_string(): event.step_materialization_data.materialization.metadata
        for result in results
        for event in result.get_asset_materialization_events()
    }


def test_an_arms_task_model_and_split_materialize(lake_root: Path, tiny_model_dir: Path) -> None:
    lake = DataLake(root=str(lake_root))
    with arms_instance() as instance:
        shared = materialize(lake, [*TASK_AND_MODEL, *SPLIT], _config(tiny_model_dir), arm="a", instance=instance)
        second_arm = materialize(lake, TASK_AND_MODEL, _config(tiny_model_dir), arm="b", instance=instance)
        (run, *_) = [record.dagster_run for record in instance.get_run_records()]
    assert run.job_name == ARM_JOB and {ARM_TAG: "b", ROUND_TAG: "0"}.items() <= run.tags.items()

    pool = pl.read_parquet(lake_root / "problem_pool" / "a" / "data.parquet")
    labeled, unlabeled, validation = (pl.read_parquet(lake_root / name / "a" / "data.parquet") for name in SPLIT)
    held_out = pl.read_parquet(lake_root / "eval_problems" / "a" / "data.parquet")
    assert (labeled.height, unlabeled.height, validation.height) == (16, 40, 20)
    assert (
        labeled.schema == PROBLEM_SCHEMA and validation.schema == PROBLEM_SCHEMA and held_out.schema == PROBLEM_SCHEMA
    )
    assert "gold_answer" not in unlabeled.columns and HIDDEN_GOLD_COLUMN in unlabeled.columns
    ids = [set(frame["problem_id"]) for frame in (labeled, unlabeled, validation)]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    # The held-out set shares no prompt with the whole pool, so with no arm's split either.
    assert 0 < held_out.height <= 50 and set(pool["prompt"]).isdisjoint(held_out["prompt"])

    checkpoint = lake_root / "base_model" / "a"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "config.json").is_file()
    assert "quantization_config" not in json.loads((checkpoint / "config.json").read_text())
    assert AutoTokenizer.from_pretrained(checkpoint).chat_template
    assert load_file(checkpoint / "model.safetensors")
    assert not any((lake_root / ".staging").iterdir()), "staging must be empty once artifacts are published"

    by_asset = _metadata(shared)
    assert by_asset[layout.LABELED_PROBLEMS]["dagster/row_count"].value == 16
    assert by_asset[layout.LABELED_PROBLEMS]["arm"].value == "a"
    assert by_asset[layout.EVAL_PROBLEMS]["dropped_overlap_with_pool"].value == 50 - held_out.height
    assert "preview" in by_asset[layout.UNLABELED_PROBLEMS] and "fingerprint" in by_asset[layout.EVAL_PROBLEMS]
    assert HIDDEN_GOLD_COLUMN not in by_asset[layout.UNLABELED_PROBLEMS]["preview"].value
    assert by_asset[layout.BASE_MODEL]["weights_sha256"].value == weights_sha256(checkpoint)
    assert by_asset[layout.BASE_MODEL]["n_parameters"].value > 0

    # Arm b names the same task and model: identical tables, and the converted model's files themselves.
    assert pl.read_parquet(lake_root / "eval_problems" / "b" / "data.parquet").equals(held_out)
    reused = _metadata(second_arm)[layout.BASE_MODEL]
    assert reused["reused_from"].value == str(checkpoint)
    assert reused["weights_sha256"].value == by_asset[layout.BASE_MODEL]["weights_sha256"].value
    weights = checkpoint / "model.safetensors"
    assert (lake_root / "base_model" / "b" / "model.safetensors").stat().st_ino == weights.stat().st_ino


def test_an_arm_of_another_model_converts_its_own(lake_root: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """A reference whose files changed is another model: nothing is read back."""
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(tiny_model_dir, copy)
    lake = DataLake(root=str(lake_root))
    config = _config(copy)
    with arms_instance() as instance:
        materialize(lake, TASK_AND_MODEL, config, arm="a", instance=instance)
        (copy / "generation_config.json").write_text(json.dumps({"max_length": 7}))
        again = materialize(lake, TASK_AND_MODEL, config, arm="b", instance=instance)
    assert "reused_from" not in _metadata(again)[layout.BASE_MODEL]
    assert json.loads((lake_root / "base_model" / "b" / "generation_config.json").read_text())["max_length"] == 7


def test_arms_draw_their_own_split_and_rematerializing_replaces_it(lake_root: Path, tiny_model_dir: Path) -> None:
    lake = DataLake(root=str(lake_root))
    with arms_instance() as instance:
        problems = [layout.PROBLEM_POOL, layout.EVAL_PROBLEMS, *SPLIT]
        materialize(lake, problems, _config(tiny_model_dir), arm="a", instance=instance)
        materialize(lake, problems, _config(tiny_model_dir), arm="b", instance=instance)
        first = pl.read_parquet(lake_root / "labeled_problems" / "a" / "data.parquet")
        # Arm b's file sets seed 1, which overrides the run config's seed 3.
        other_arm = pl.read_parquet(lake_root / "labeled_problems" / "b" / "data.parquet")
        assert first["problem_id"].to_list() != other_arm["problem_id"].to_list()
        materialize(lake, SPLIT, _config(tiny_model_dir, seed=4), arm="a", instance=instance)
    second = pl.read_parquet(lake_root / "labeled_problems" / "a" / "data.parquet")
    assert first["problem_id"].to_list() != second["problem_id"].to_list()
    assert sorted(p.name for p in (lake_root / "labeled_problems" / "a").iterdir()) == ["data.parquet"]


def test_an_arm_whose_task_is_a_gsm8k_subset_draws_its_problems_from_it(lake_root: Path, tiny_model_dir: Path) -> None:
    """A task owns its problems whatever their kind: arm `words-s0` names a GSM8K subset (pool from the train split,
    held-out set from the test split), which wins over the run config's reasoning_gym sources, as a reasoning_gym
    task's would."""
    lake = DataLake(root=str(lake_root))
    with arms_instance() as instance:
        instance.add_dynamic_partitions("arm", ["words-s0"])
        materialize(lake, [*TASK_AND_MODEL, *SPLIT], _config(tiny_model_dir), arm="words-s0", instance=instance)

    task = load_tasks()["gsm8k-slice"]
    pool, held_out = (lake.read_table(dg.AssetKey(name), "words-s0") for name in TASK_AND_MODEL[:2])
    train, test = (load_problems(**source.load_kwargs()) for source in (task.training_source, task.eval_source))
    assert pool.equals(train) and pool.height == 100 and set(pool["source"]) == {"gsm8k:train"}
    assert held_out.height <= 30 and set(held_out["problem_id"]) <= set(test["problem_id"])
    labeled = lake.read_table(dg.AssetKey(layout.LABELED_PROBLEMS), "words-s0")
    assert labeled.height == 16 and set(labeled["problem_id"]) <= set(pool["problem_id"])
