"""The step guard inside real TRL GRPO runs on a tiny model (steps poisoned through a gradient hook)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from noisy_student_assets.core.settings import GRPOSettings
from noisy_student_assets.core.training.base import TrainingRun
from noisy_student_assets.core.training.grpo import build_training_dataset, train_grpo
from noisy_student_assets.core.training.guards import (
    NonFiniteTrainingError,
    non_finite_tensors,
)
from tests.poison import PoisonGradients
from tests.training_data import SYSTEM_PROMPT, TINY_RUN, labeled_frame

RUN = TINY_RUN.model_copy(update={"max_steps": 3})


@pytest.fixture(scope="module")
def training_set():
    return build_training_dataset(labeled_frame(), None, SYSTEM_PROMPT)


def _all_finite(checkpoint: Path) -> bool:
    return not non_finite_tensors(checkpoint)[0]


def train_poisoned(model_dir: Path, dataset, settings: GRPOSettings, root: Path, steps: set[int], warn=None):
    """`settings`' GRPO run with the gradients of `steps` poisoned, checkpointing into `root / "work"`, saved into
    `root / "out"`."""
    run = TrainingRun(root / "work", callbacks=(PoisonGradients(steps),), warn=warn)
    return train_grpo(model_dir, dataset, settings, root / "out", run)


def test_a_poisoned_step_is_skipped_and_training_finishes_finite(sevens_model_dir, training_set, tmp_path: Path):
    warnings = []
    result = train_poisoned(sevens_model_dir, training_set, RUN, tmp_path, {2}, warn=warnings.append)
    assert result.metrics["skipped_steps"] == 1 and result.metrics["steps"] == 3
    assert _all_finite(result.checkpoint_dir)
    assert len(warnings) == 1 and warnings[0].startswith("step 2: non-finite gradient norm")
    initial, trained = (
        load_file(sevens_model_dir / "model.safetensors"),
        load_file(tmp_path / "out" / "model.safetensors"),
    )
    assert any(not torch.equal(initial[name], trained[name]) for name in initial), "steps 1 and 3 still trained"


def test_a_skipped_step_updates_nothing(sevens_model_dir, training_set, tmp_path: Path):
    settings = RUN.model_copy(update=dict(max_steps=1, use_lora=False, save_steps=0))
    result = train_poisoned(sevens_model_dir, training_set, settings, tmp_path, {1})
    assert result.metrics["skipped_steps"] == 1
    initial, trained = (
        load_file(sevens_model_dir / "model.safetensors"),
        load_file(tmp_path / "out" / "model.safetensors"),
    )
    assert all(torch.equal(initial[name], trained[name]) for name in initial)


def test_consecutive_poisoned_steps_stop_training_and_a_relaunch_resumes(
    sevens_model_dir, training_set, tmp_path: Path
):
    settings = RUN.model_copy(update=dict(max_steps=5))
    work_dir = tmp_path / "work"
    with pytest.raises(NonFiniteTrainingError) as stopped:
        train_poisoned(sevens_model_dir, training_set, settings, tmp_path, {2, 3, 4, 5})
    message = str(stopped.value)
    assert "training stopped at step 4: 3 consecutive optimizer steps (steps 2, 3, 4)" in message
    assert f"the last good resumable checkpoint is {work_dir / 'checkpoint-1'}" in message
    assert not (tmp_path / "out").exists(), "nothing is saved for publishing"
    assert [path.name for path in work_dir.glob("checkpoint-*")] == ["checkpoint-1"], "no checkpoint of a skipped step"

    resumed = train_grpo(sevens_model_dir, training_set, settings, tmp_path / "out", TrainingRun(work_dir))
    assert resumed.metrics["resumed_from_step"] == 1 and resumed.metrics["steps"] == 5
    assert resumed.metrics["skipped_steps"] == 0 and _all_finite(resumed.checkpoint_dir)


def test_without_a_good_checkpoint_the_error_says_a_rerun_starts_over(sevens_model_dir, training_set, tmp_path: Path):
    with pytest.raises(NonFiniteTrainingError, match="no resumable checkpoint was saved"):
        settings = RUN.model_copy(update=dict(max_consecutive_skipped_steps=2))
        train_poisoned(sevens_model_dir, training_set, settings, tmp_path, {1, 2, 3})
