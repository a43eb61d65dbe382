"""The student's SFT and DPO modes: short real TRL/peft runs on a tiny model (trains, resumes from its last
checkpoint, saves a merged finite checkpoint without the student's noise)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from noisy_student_assets.core.settings import GRPOSettings
from noisy_student_assets.core.training.base import TrainingRun
from noisy_student_assets.core.training.guards import non_finite_tensors
from noisy_student_assets.core.training.modes.dpo import train_dpo
from noisy_student_assets.core.training.modes.sft import train_sft
from tests.training_data import TINY_SUPERVISED


def train(mode: str, model_dir: Path, dataset, settings: GRPOSettings, root: Path, callbacks=(), **kwargs):
    run = TrainingRun(root / "work", callbacks=callbacks)
    if mode == "sft":
        return train_sft(model_dir, dataset, settings, root / "merged", run, **kwargs)
    return train_dpo(model_dir, dataset, settings, root / "merged", run, beta=0.1, **kwargs)


@pytest.fixture(scope="module")
def runs(sevens_model_dir: Path, sft_set, dpo_set, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two steps of each mode, checkpointed every step; the resume tests continue from their work dirs."""
    out = {}
    for mode, dataset in (("sft", sft_set), ("dpo", dpo_set)):
        root = tmp_path_factory.mktemp(mode)
        out[mode] = (train(mode, sevens_model_dir, dataset, TINY_SUPERVISED, root), root)
    return out


@pytest.mark.parametrize("mode", ["sft", "dpo"])
def test_a_mode_trains_lora_and_saves_a_merged_finite_checkpoint(mode: str, runs, sevens_model_dir: Path) -> None:
    result, _ = runs[mode]
    saved = result.checkpoint_dir
    assert not (saved / "adapter_config.json").exists()
    assert non_finite_tensors(saved)[0] == []
    initial, trained = load_file(sevens_model_dir / "model.safetensors"), load_file(saved / "model.safetensors")
    assert initial.keys() == trained.keys()
    assert any(not torch.equal(initial[name], trained[name]) for name in initial)
    assert result.metrics["steps"] == 2 and result.metrics["skipped_steps"] == 0
    logged = "mean_token_accuracy_last_quarter" if mode == "sft" else "preference_accuracy_last_quarter"
    assert 0.0 <= result.metrics[logged] <= 1.0


@pytest.mark.parametrize("mode", ["sft", "dpo"])
def test_a_mode_resumes_from_its_latest_checkpoint(
    mode: str, runs, sevens_model_dir: Path, sft_set, dpo_set, tmp_path: Path
) -> None:
    _, root = runs[mode]
    assert [path.name for path in (root / "work").glob("checkpoint-*")] == ["checkpoint-2"]
    dataset = sft_set if mode == "sft" else dpo_set
    result = train(mode, sevens_model_dir, dataset, TINY_SUPERVISED.model_copy(update=dict(max_steps=3)), root)
    assert result.metrics["resumed_from_step"] == 2 and result.metrics["steps"] == 3
    assert [entry["step"] for entry in result.log_history if "loss" in entry] == [1, 2, 3]


class DropoutSeen(TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[float] = []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.seen.append(model.config.attention_dropout)


def test_model_dropout_is_on_while_training_and_off_in_the_checkpoint(
    sevens_model_dir: Path, sft_set, tmp_path: Path
) -> None:
    seen = DropoutSeen()
    result = train(
        "sft",
        sevens_model_dir,
        sft_set,
        TINY_SUPERVISED.model_copy(update=dict(max_steps=1, save_steps=0)),
        tmp_path,
        model_dropout=0.1,
        callbacks=(seen,),
    )
    assert seen.seen == [0.1]
    assert json.loads((result.checkpoint_dir / "config.json").read_text())["attention_dropout"] == 0.0


@pytest.mark.parametrize(
    ("mode", "message"), [("sft", "cannot fill a step of 8 completions"), ("dpo", "cannot fill a step of 4 pairs")]
)
def test_too_few_rows_for_one_step_are_rejected_before_loading(
    mode: str, message: str, sft_set, dpo_set, tmp_path: Path
) -> None:
    dataset = (sft_set if mode == "sft" else dpo_set).select(range(3))
    with pytest.raises(ValueError, match=message):
        train(mode, tmp_path / "no-model", dataset, TINY_SUPERVISED, tmp_path)
