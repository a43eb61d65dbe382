"""The student's SFT and DPO modes: their TRL datasets, and short real TRL/peft runs on a tiny model
(trains, resumes from its last checkpoint, saves a merged finite checkpoint without the student's noise)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from noisy_student_assets.core.prompts import build_messages
from noisy_student_assets.core.pseudo_labels.student_data import dpo_pairs, sft_rows
from noisy_student_assets.core.training.distillation import build_dpo_dataset, build_sft_dataset, train_dpo, train_sft
from noisy_student_assets.core.training.grpo import GRPOSettings
from noisy_student_assets.core.training.guards import non_finite_tensors

# A step: 2 problems x 4 completions (SFT: 8 rows; DPO: 4 pairs).
TINY = GRPOSettings(max_steps=2, num_generations=4, prompts_per_step=2, learning_rate=1e-2, save_steps=1)
ANSWERS = {f"p{i}": ["7", "7", "7", "8"] if i % 2 else ["7", "7", None, "7"] for i in range(6)}


@pytest.fixture(scope="module")
def votes() -> tuple[pl.DataFrame, pl.DataFrame]:
    generations = pl.DataFrame(
        [
            {"problem_id": pid, "sample_index": i, "completion": f"It is \\boxed{{{a}}}" if a else "no idea", "answer": a}
            for pid, answers in ANSWERS.items()
            for i, a in enumerate(answers)
        ],
        schema={"problem_id": pl.Utf8, "sample_index": pl.Int32, "completion": pl.Utf8, "answer": pl.Utf8},
    )
    labels = pl.DataFrame({"problem_id": list(ANSWERS), "prompt": [f"What is {i} + 7 - {i}?" for i in range(6)], "pseudo_label": "7", "kept": True})
    return generations, labels


@pytest.fixture(scope="module")
def sft_set(votes):
    return build_sft_dataset(sft_rows(*votes, group_size=TINY.num_generations), "", seed=0)


@pytest.fixture(scope="module")
def dpo_set(votes):
    return build_dpo_dataset(dpo_pairs(*votes, pairs_per_problem=TINY.num_generations // 2), "", seed=0)


def train(mode: str, model_dir: Path, dataset, settings: GRPOSettings, root: Path, **kwargs):
    if mode == "sft":
        return train_sft(model_dir, dataset, settings, root / "merged", work_dir=root / "work", **kwargs)
    return train_dpo(model_dir, dataset, settings, root / "merged", beta=0.1, work_dir=root / "work", **kwargs)


@pytest.fixture(scope="module")
def runs(sevens_model_dir: Path, sft_set, dpo_set, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two steps of each mode, checkpointed every step; the resume tests continue from their work dirs."""
    out = {}
    for mode, dataset in (("sft", sft_set), ("dpo", dpo_set)):
        root = tmp_path_factory.mktemp(mode)
        out[mode] = (train(mode, sevens_model_dir, dataset, TINY, root), root)
    return out


def test_training_sets_keep_each_problem_s_group_together_in_a_seeded_order(votes) -> None:
    rows = sft_rows(*votes, group_size=4)
    dataset = build_sft_dataset(rows, "", seed=0)
    order = list(dataset["problem_id"])
    groups = [order[i : i + 4] for i in range(0, len(order), 4)]
    assert all(len(set(group)) == 1 for group in groups) and len(groups) == 6
    assert [g[0] for g in groups] != sorted(g[0] for g in groups)  # shuffled...
    assert order == list(build_sft_dataset(rows, "", seed=0)["problem_id"])  # ...by the seed
    assert order != list(build_sft_dataset(rows, "", seed=1)["problem_id"])
    assert dataset[0]["prompt"] == build_messages(votes[1].filter(pl.col("problem_id") == order[0])["prompt"].item())
    assert dataset[0]["completion"][0]["role"] == "assistant"


def test_dpo_set_is_conversational_preference_rows(dpo_set) -> None:
    assert set(dpo_set.column_names) == {"prompt", "chosen", "rejected"}
    assert len(dpo_set) == 6 * 2  # every problem has a dissenting sample (an 8, or no answer): two pairs each
    row = dpo_set[0]
    assert row["chosen"] == [{"role": "assistant", "content": "It is \\boxed{7}"}]
    assert row["rejected"][0]["content"] in ("It is \\boxed{8}", "no idea")


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
def test_a_mode_resumes_from_its_latest_checkpoint(mode: str, runs, sevens_model_dir: Path, sft_set, dpo_set, tmp_path: Path) -> None:
    _, root = runs[mode]
    assert [path.name for path in (root / "work").glob("checkpoint-*")] == ["checkpoint-2"]
    dataset = sft_set if mode == "sft" else dpo_set
    result = train(mode, sevens_model_dir, dataset, replace(TINY, max_steps=3), root)
    assert result.metrics["resumed_from_step"] == 2 and result.metrics["steps"] == 3
    assert [entry["step"] for entry in result.log_history if "loss" in entry] == [1, 2, 3]


class DropoutSeen(TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[float] = []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.seen.append(model.config.attention_dropout)


def test_model_dropout_is_on_while_training_and_off_in_the_checkpoint(sevens_model_dir: Path, sft_set, tmp_path: Path) -> None:
    seen = DropoutSeen()
    result = train("sft", sevens_model_dir, sft_set, replace(TINY, max_steps=1, save_steps=0), tmp_path, model_dropout=0.1, callbacks=[seen])
    assert seen.seen == [0.1]
    assert json.loads((result.checkpoint_dir / "config.json").read_text())["attention_dropout"] == 0.0


@pytest.mark.parametrize(("mode", "message"), [("sft", "cannot fill a step of 8 completions"), ("dpo", "cannot fill a step of 4 pairs")])
def test_too_few_rows_for_one_step_are_rejected_before_loading(mode: str, message: str, sft_set, dpo_set, tmp_path: Path) -> None:
    dataset = (sft_set if mode == "sft" else dpo_set).select(range(3))
    with pytest.raises(ValueError, match=message):
        train(mode, tmp_path / "no-model", dataset, TINY, tmp_path)
