"""A broken model is never published and never evaluated as if it were a result: assets materialized
in-process on copies of a lake that holds a tiny labeled-RL teacher."""

from __future__ import annotations

import math
import shutil
from dataclasses import replace

import dagster as dg
import mlflow
import pytest
import torch
from safetensors.torch import load_file, save_file

from noisy_student_assets.core import layout
from noisy_student_assets.core.checkpoints import weights_sha256
from noisy_student_assets.core.training import base as trainer_base
from noisy_student_assets.core.training.modes import grpo as grpo_mode
from noisy_student_assets.defs.code_location import ASSETS_AND_CHECKS
from noisy_student_assets.defs.current_defaults import CURRENT_DEFAULTS
from resources.data_lake import DataLake
from resources.tracking import MlflowTracking
from tests.lakes import arms_instance, isolated_resources, run_checks
from tests.poison import PoisonGradients
from tests.tiny_configs import TINY_EVAL, TINY_GRPO, TINY_SMOKE

ARM = "a"
LABELED_RL = dg.AssetKey(layout.LABELED_RL)
LABELED_RL_EVAL = dg.AssetKey(layout.LABELED_RL_EVAL)
SMOKE = {f"{layout.LABELED_RL}_smoke_generation": {"config": TINY_SMOKE}}


def _run(lake: DataLake, selection, config: dict, arm: str | None = ARM) -> dg.ExecuteInJobResult:
    with arms_instance() as instance:
        return dg.materialize(
            ASSETS_AND_CHECKS,
            selection=selection,
            resources=isolated_resources(lake),
            run_config=config,
            partition_key=arm,
            instance=instance,
            raise_on_error=False,
        )


def _step_failures(result: dg.ExecuteInJobResult) -> dict[str, str]:
    """Each failed step's error messages, its causes' included (a retried step fails "Exceeded max_retries")."""
    failures = {}
    for event in result.all_events:
        if event.event_type_value == "STEP_FAILURE":
            error, messages = event.event_specific_data.error, []
            while error is not None:
                messages.append(error.message)
                error = error.cause
            failures[event.step_key] = "\n".join(messages)
    return failures


def _materialized(result: dg.ExecuteInJobResult) -> set[str]:
    return {event.asset_key.to_user_string() for event in result.get_asset_materialization_events()}


def test_training_that_only_diverges_fails_and_publishes_nothing(lake_copy, monkeypatch) -> None:
    """Every step's gradients are NaN (the asset's GRPO runs with a poisoning callback added)."""
    train_grpo = grpo_mode.train_grpo

    def poisoned_train_grpo(init_dir, dataset, settings, out_dir, run, **kwargs):
        poisoned = replace(run, callbacks=(*run.callbacks, PoisonGradients({1, 2, 3, 4})))
        return train_grpo(init_dir, dataset, settings, out_dir, poisoned, **kwargs)

    monkeypatch.setattr(grpo_mode, "train_grpo", poisoned_train_grpo)
    lake = lake_copy()
    shutil.rmtree(lake.artifact_dir(LABELED_RL, ARM))
    config = {
        "ops": {
            layout.LABELED_RL: {"config": {"grpo": TINY_GRPO | {"max_steps": 4, "save_steps": 0}}},
            layout.LABELED_RL_EVAL: {"config": TINY_EVAL},
        }
        | SMOKE
    }
    result = _run(lake, [LABELED_RL, LABELED_RL_EVAL], config)
    assert not result.success
    message = _step_failures(result)[layout.LABELED_RL]
    assert "training stopped at step 3: 3 consecutive optimizer steps (steps 1, 2, 3)" in message
    assert "Nothing was published" in message
    assert not lake.artifact_dir(LABELED_RL, ARM).exists()
    assert _materialized(result) == set(), "neither the checkpoint nor its eval"


def _poison_one_tensor(lake: DataLake) -> str:
    weights_file = lake.artifact_dir(LABELED_RL, ARM) / "model.safetensors"
    tensors = load_file(weights_file)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = math.nan
    save_file(tensors, weights_file, metadata={"format": "pt"})
    return name


def test_a_checkpoint_with_one_nan_tensor_fails_its_check_and_blocks_downstream(lake_copy) -> None:
    lake = lake_copy()
    poisoned = _poison_one_tensor(lake)
    selection = dg.AssetSelection.checks_for_assets(LABELED_RL) | dg.AssetSelection.assets(LABELED_RL_EVAL)
    config = {"ops": {layout.LABELED_RL_EVAL: {"config": TINY_EVAL}} | SMOKE}
    result = _run(lake, selection, config)
    assert not result.success
    finite = next(c for c in result.get_asset_check_evaluations() if c.check_name == "finite_weights")
    assert not finite.passed and finite.severity == dg.AssetCheckSeverity.ERROR
    assert finite.metadata["non_finite_tensors"].value == 1 and poisoned in finite.description
    assert layout.LABELED_RL_EVAL not in _materialized(result)
    assert not lake.artifact_dir(LABELED_RL_EVAL, ARM).exists()


def test_a_healthy_checkpoint_passes_both_checks(lake_copy) -> None:
    lake = lake_copy()
    result = run_checks(lake, layout.LABELED_RL, {"ops": SMOKE}, ARM)
    assert result.success
    # the UI's *Execute checks* also runs the current-defaults check, which judges materializations (none here)
    verdicts = {
        c.check_name: c.passed for c in result.get_asset_check_evaluations() if c.check_name != CURRENT_DEFAULTS
    }
    assert verdicts == {"finite_weights": True, "smoke_generation": True}


def test_the_smoke_check_fails_when_every_completion_runs_to_the_limit(lake_copy) -> None:
    """The random teacher never ends a completion by itself: with the default bound the check fails."""
    lake = lake_copy()
    smoke = {"prompts": 2, "max_new_tokens": 8, "max_empty_rate": 1.0}
    config = {"ops": {f"{layout.LABELED_RL}_smoke_generation": {"config": smoke}}}
    result = run_checks(lake, layout.LABELED_RL, config, ARM)
    smoke = next(c for c in result.get_asset_check_evaluations() if c.check_name == "smoke_generation")
    assert not smoke.passed and "100% ran to the token limit" in smoke.description
    assert smoke.metadata["truncation_rate"].value == 1.0


def test_a_degenerate_eval_fails_its_check_and_records_its_config(lake_copy) -> None:
    """The random teacher answers nothing and runs every completion to the limit: with the default
    thresholds its eval is degenerate, and the report says so instead of a silent 0.0."""
    lake = lake_copy()
    eval_config = {"backend": "transformers", "max_new_tokens": 8, "samples": 0, "ks": []}
    result = _run(lake, [LABELED_RL_EVAL], {"ops": {layout.LABELED_RL_EVAL: {"config": eval_config}}})
    assert not result.success
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == "eval_not_degenerate" and not check.passed
    assert "answer rate 0.000 < 0.1" in check.description and "truncation rate 1.000 > 0.9" in check.description
    assert check.metadata["truncation_rate"].value == 1.0
    (event,) = result.get_asset_materialization_events()
    metadata = event.step_materialization_data.materialization.metadata
    assert metadata["truncation_rate"].value == 1.0
    resolved = metadata["config"].value
    assert (
        resolved["max_new_tokens"] == 8
        and resolved["max_truncation_rate"] == 0.9
        and resolved["backend"] == "transformers"
    )
    mlflow.set_tracking_uri(MlflowTracking(lake=lake).resolved_tracking_uri)
    params = mlflow.get_run(metadata["mlflow_run_id"].value).data.params
    assert params["config.max_new_tokens"] == "8" and params["config.max_truncation_rate"] == "0.9"


def test_a_partial_source_override_is_the_whole_source(lake_copy, tmp_path) -> None:
    lake = lake_copy()
    problems = tmp_path / "held_out.jsonl"
    problems.write_text("".join(f'{{"prompt": "What is {i} + 1?", "answer": "{i + 1}"}}\n' for i in range(120)))
    config = {"ops": {layout.EVAL_PROBLEMS: {"config": {"source": {"kind": "file", "path": str(problems)}}}}}
    result = _run(lake, [layout.EVAL_PROBLEMS], config)
    assert result.success
    assert lake.read_table(dg.AssetKey(layout.EVAL_PROBLEMS), ARM).height == 120, (
        "no size inherited from the profile's source"
    )
    (event,) = result.get_asset_materialization_events()
    resolved = event.step_materialization_data.materialization.metadata["config"].value["source"]
    assert resolved["kind"] == "file" and resolved["size"] == 0 and resolved["name"] == ""
    stray = {"ops": {layout.EVAL_PROBLEMS: {"config": {"source": {"kind": "file", "path": str(problems), "seed": 3}}}}}
    failed = _run(lake, [layout.EVAL_PROBLEMS], stray)
    assert not failed.success
    assert (
        "source kind 'file' reads only answer_field, path, prompt_field, size; remove seed=3"
        in _step_failures(failed)[layout.EVAL_PROBLEMS]
    )


@pytest.fixture
def unchanged(lake_copy):
    """A lake and the sha of its published labeled-RL checkpoint."""
    lake = lake_copy()
    return lake, weights_sha256(lake.artifact_dir(LABELED_RL, ARM))


def test_the_published_checkpoint_stays_when_a_retrain_diverges(unchanged, monkeypatch) -> None:
    lake, sha = unchanged
    original = trainer_base.save_merged

    def save_then_break(model, tokenizer, out_dir):
        original(model, tokenizer, out_dir)
        tensors = load_file(out_dir / "model.safetensors")
        first = sorted(tensors)[0]
        tensors[first] = torch.full_like(tensors[first], math.nan)
        save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})

    monkeypatch.setattr(trainer_base, "save_merged", save_then_break)
    config = {"ops": {layout.LABELED_RL: {"config": {"grpo": TINY_GRPO | {"save_steps": 0}}}} | SMOKE}
    result = _run(lake, [LABELED_RL], config)
    assert not result.success
    assert "tensors hold NaN or inf" in _step_failures(result)[layout.LABELED_RL]
    assert weights_sha256(lake.artifact_dir(LABELED_RL, ARM)) == sha, (
        "the previous checkpoint is still the published one"
    )
