"""GRPO training: the training set's construction, the reward functions, and short real TRL/peft runs
on a tiny model (no mocks)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from noisy_student_assets.core.prompts import NOISY_TEMPLATES, build_messages, prompt_template
from noisy_student_assets.core.training.grpo import (
    GRPOSettings,
    answer_reward,
    build_training_dataset,
    format_reward_fn,
    grpo_config,
    train_grpo,
    vote_share_reward,
)

SYSTEM_PROMPT = "Answer with \\boxed{}."
SEVEN = "7"

# Short runs: 2 prompts x 4 completions of at most 8 tokens per step.
TINY_RUN = GRPOSettings(
    max_steps=2, num_generations=4, prompts_per_step=2, max_completion_length=8, learning_rate=1e-2, save_steps=1
)


def labeled_frame(n: int = 4) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "problem_id": [f"gold-{i}" for i in range(n)],
            "prompt": [f"What is {i} + 7 - {i}?" for i in range(n)],
            "gold_answer": [SEVEN] * n,
            "source": ["reasoning_gym"] * n,
        }
    )


def pseudo_frame(n: int = 4) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "problem_id": [f"pseudo-{i}" for i in range(n)],
            "prompt": [f"What is 14 - 7 + {i} - {i}?" for i in range(n)],
            "pseudo_label": [SEVEN] * n,
            "agreement": [0.75] * n,
        }
    )


@pytest.fixture(scope="module")
def training_set():
    return build_training_dataset(labeled_frame(), pseudo_frame(), SYSTEM_PROMPT)


@pytest.fixture(scope="module")
def lora_run(sevens_model_dir: Path, training_set, tmp_path_factory: pytest.TempPathFactory):
    """Two LoRA steps, checkpointed every step; the resume test continues from its work dir."""
    root = tmp_path_factory.mktemp("lora_run")
    result = train_grpo(sevens_model_dir, training_set, TINY_RUN, root / "merged", work_dir=root / "work")
    return result, root / "work"


# --- training set ---------------------------------------------------------------------------------


def test_dataset_mixes_every_labeled_and_pseudo_labeled_row():
    dataset = build_training_dataset(labeled_frame(3), pseudo_frame(5), SYSTEM_PROMPT)
    assert dataset.column_names == ["prompt", "target", "label_source", "problem_id"]
    rows = {row["problem_id"]: row for row in dataset}
    assert len(dataset) == 8
    assert sorted(rows) == sorted([f"gold-{i}" for i in range(3)] + [f"pseudo-{i}" for i in range(5)])
    assert {row["label_source"] for pid, row in rows.items() if pid.startswith("gold")} == {"gold"}
    assert {row["label_source"] for pid, row in rows.items() if pid.startswith("pseudo")} == {"pseudo"}
    assert rows["gold-2"]["prompt"] == build_messages("What is 2 + 7 - 2?", SYSTEM_PROMPT)


def test_targets_are_gold_answers_and_pseudo_labels():
    labeled = labeled_frame(2).with_columns(gold_answer=pl.Series(["10", "11"]))
    pseudo = pseudo_frame(2).with_columns(pseudo_label=pl.Series(["20", "21"]))
    targets = {row["problem_id"]: row["target"] for row in build_training_dataset(labeled, pseudo, SYSTEM_PROMPT)}
    assert targets == {"gold-0": "10", "gold-1": "11", "pseudo-0": "20", "pseudo-1": "21"}


def test_without_pseudo_labels_only_labeled_rows():
    dataset = build_training_dataset(labeled_frame(3), None, SYSTEM_PROMPT)
    assert list(dataset["label_source"]) == ["gold"] * 3


def test_shuffle_is_deterministic_in_the_seed():
    def order(seed: int) -> list[str]:
        dataset = build_training_dataset(labeled_frame(10), pseudo_frame(10), SYSTEM_PROMPT, seed=seed)
        return list(dataset["problem_id"])

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert order(0) != sorted(order(0))  # shuffled, not concatenated


def test_no_other_column_of_the_pseudo_labels_reaches_training():
    poisoned = pseudo_frame().with_columns(hidden_gold_answer=pl.lit("999"), gold_answer=pl.lit("999"))
    clean = build_training_dataset(labeled_frame(), pseudo_frame(), SYSTEM_PROMPT)
    assert build_training_dataset(labeled_frame(), poisoned, SYSTEM_PROMPT).to_list() == clean.to_list()


def test_empty_training_set_is_rejected():
    with pytest.raises(ValueError, match="no training rows"):
        build_training_dataset(labeled_frame(0), pseudo_frame(0), SYSTEM_PROMPT)


def test_missing_target_names_the_row():
    pseudo = pseudo_frame(2).with_columns(pseudo_label=pl.Series([SEVEN, None], dtype=pl.String))
    with pytest.raises(ValueError, match="pseudo-1"):
        build_training_dataset(labeled_frame(), pseudo, SYSTEM_PROMPT)


# --- settings and TRL config ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [{"num_generations": 1}, {"loss_type": "ppo"}, {"scale_rewards": "std"}, {"gradient_accumulation_steps": 3}],
)
def test_invalid_settings_are_rejected(change):
    with pytest.raises(ValueError):
        GRPOSettings(**change)


def test_each_step_trains_on_prompts_per_step_groups(tmp_path: Path):
    settings = GRPOSettings(
        num_generations=4, prompts_per_step=3, gradient_accumulation_steps=2, format_reward_weight=0.5
    )
    config = grpo_config(settings, tmp_path, device="cpu", report_to=["none"])
    assert config.per_device_train_batch_size * config.gradient_accumulation_steps == 12
    assert config.generation_batch_size == 12 and config.steps_per_generation == 2
    assert config.reward_weights == [1.0, 0.5]
    assert config.bf16 is False and config.use_cpu is True and config.save_strategy == "no"


# --- rewards --------------------------------------------------------------------------------------


def test_answer_reward_grades_plain_and_conversational_completions():
    plain = ["so the answer is \\boxed{12}", "\\boxed{13}", "no idea"]
    conversational = [[{"role": "assistant", "content": text}] for text in plain]
    targets = ["12", "12", "12"]
    assert answer_reward(plain, targets) == [1.0, 0.0, 0.0]
    assert answer_reward(conversational, targets) == [1.0, 0.0, 0.0]


def test_answer_reward_logs_the_mean_per_label_source():
    logged = {}
    answer_reward(
        ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}"],
        ["1", "1", "3"],
        label_source=["gold", "gold", "pseudo"],
        log_metric=logged.__setitem__,
    )
    assert logged == {"answer_reward/gold": 0.5, "answer_reward/pseudo": 1.0}


def test_format_reward_is_independent_of_correctness():
    completions = ["\\boxed{13}", [{"role": "assistant", "content": "it is 12"}]]
    assert format_reward_fn(completions, target=["12", "12"]) == [1.0, 0.0]


# --- training -------------------------------------------------------------------------------------


def test_lora_run_saves_a_merged_checkpoint_with_new_weights(lora_run, sevens_model_dir: Path):
    result, _ = lora_run
    saved = result.checkpoint_dir
    assert not (saved / "adapter_config.json").exists()
    assert "peft" not in (saved / "config.json").read_text().lower()
    assert json.loads((saved / "config.json").read_text())["use_cache"] is True
    model = AutoModelForCausalLM.from_pretrained(saved)
    assert not any("lora" in name for name in model.state_dict())
    initial_template = AutoTokenizer.from_pretrained(sevens_model_dir).chat_template
    assert AutoTokenizer.from_pretrained(saved).chat_template == initial_template
    initial, trained = load_file(sevens_model_dir / "model.safetensors"), load_file(saved / "model.safetensors")
    assert initial.keys() == trained.keys()
    assert any(not torch.equal(initial[name], trained[name]) for name in initial)


def test_lora_run_reports_rewards_and_counts(lora_run):
    result, _ = lora_run
    assert (result.n_train_rows, result.n_gold_rows, result.n_pseudo_rows) == (8, 4, 4)
    step_logs = [entry for entry in result.log_history if "reward" in entry]
    assert [entry["step"] for entry in step_logs] == [1, 2]
    assert any(entry["reward_std"] > 0 for entry in step_logs)  # else no advantage, no learning signal
    assert result.metrics["steps"] == 2 and result.metrics["resumed_from_step"] == 0
    assert 0.0 <= result.metrics["answer_reward_last_quarter"] <= 1.0


def test_resume_continues_from_the_latest_checkpoint(lora_run, sevens_model_dir: Path, training_set, tmp_path: Path):
    _, work_dir = lora_run
    assert [path.name for path in work_dir.glob("checkpoint-*")] == ["checkpoint-2"]
    result = train_grpo(
        sevens_model_dir, training_set, replace(TINY_RUN, max_steps=3), tmp_path / "merged", work_dir=work_dir
    )
    assert result.metrics["resumed_from_step"] == 2 and result.metrics["steps"] == 3
    assert [entry["step"] for entry in result.log_history if "reward" in entry] == [1, 2, 3]
    assert (work_dir / "checkpoint-3").is_dir()


def test_full_fine_tune_changes_untargeted_weights(sevens_model_dir: Path, training_set, tmp_path: Path):
    settings = replace(TINY_RUN, max_steps=1, use_lora=False, save_steps=0)
    result = train_grpo(sevens_model_dir, training_set, settings, tmp_path / "merged", work_dir=tmp_path / "work")
    initial = load_file(sevens_model_dir / "model.safetensors")
    trained = load_file(result.checkpoint_dir / "model.safetensors")
    assert not torch.equal(initial["lm_head.weight"], trained["lm_head.weight"])  # LoRA would not touch it
    assert not list((tmp_path / "work").glob("checkpoint-*"))


@pytest.mark.parametrize(("n_rows", "message"), [(0, "no training rows"), (1, "cannot fill a step of 2 prompts")])
def test_too_small_a_dataset_is_rejected_before_loading(tmp_path: Path, training_set, n_rows: int, message: str):
    too_small = training_set.select(range(n_rows))
    with pytest.raises(ValueError, match=message):
        train_grpo(tmp_path / "no-model", too_small, TINY_RUN, tmp_path / "out", work_dir=tmp_path / "work")


# --- the student's prompt noise and soft reward ---------------------------------------------------


def test_prompt_noise_renders_prompts_through_seeded_templates():
    def prompts(seed: int, noise: bool) -> dict[str, str]:
        dataset = build_training_dataset(labeled_frame(12), None, "", seed=seed, prompt_noise=noise)
        return {row["problem_id"]: row["prompt"][-1]["content"] for row in dataset}

    plain, noisy = prompts(0, False), prompts(0, True)
    assert plain == {f"gold-{i}": build_messages(f"What is {i} + 7 - {i}?")[0]["content"] for i in range(12)}
    assert noisy == prompts(0, True) and noisy != prompts(1, True)
    used = {template for template in range(len(NOISY_TEMPLATES)) for pid, text in noisy.items()
            if text == build_messages(f"What is {pid.split('-')[1]} + 7 - {pid.split('-')[1]}?", template=template)[0]["content"]}
    assert len(used) > 1
    assert all("\\boxed{}" in template for template in NOISY_TEMPLATES)
    assert NOISY_TEMPLATES[0] == json.loads(prompt_template())[0]["content"]  # template 0 is every stage's format


def test_vote_share_reward_pays_the_answer_s_share_of_the_votes_and_gold_rows_hard():
    shares = json.dumps([["12", 0.625], ["13", 0.25]])
    completions = ["\\boxed{12}", "\\boxed{13}", "\\boxed{14}", "no answer", "\\boxed{5}", "\\boxed{6}"]
    targets = ["12", "12", "12", "12", "5", "5"]
    vote_shares = [shares] * 4 + ["[]", "[]"]
    logged = {}
    rewards = vote_share_reward(
        completions, targets, vote_shares, label_source=["pseudo"] * 4 + ["gold"] * 2, log_metric=logged.__setitem__
    )
    assert rewards == [0.625, 0.25, 0.0, 0.0, 1.0, 0.0]
    assert logged == {"answer_reward/gold": 0.5, "answer_reward/pseudo": 0.25}  # agreement with the label, as before


def test_vote_shares_join_the_pseudo_labeled_rows_only():
    shares = pl.DataFrame({"problem_id": ["pseudo-0", "pseudo-1"], "vote_shares": ['[["7", 0.75]]', '[["7", 1.0]]']})
    dataset = build_training_dataset(labeled_frame(2), pseudo_frame(2), SYSTEM_PROMPT, vote_shares=shares)
    assert {row["problem_id"]: row["vote_shares"] for row in dataset} == {
        "gold-0": "[]", "gold-1": "[]", "pseudo-0": '[["7", 0.75]]', "pseudo-1": '[["7", 1.0]]'
    }


def test_grpo_trains_on_the_vote_share_reward(sevens_model_dir: Path, tmp_path: Path):
    shares = pl.DataFrame({"problem_id": [f"pseudo-{i}" for i in range(4)], "vote_shares": '[["7", 0.75], ["8", 0.25]]'})
    dataset = build_training_dataset(labeled_frame(), pseudo_frame(), SYSTEM_PROMPT, vote_shares=shares)
    settings = replace(TINY_RUN, max_steps=1, save_steps=0)
    result = train_grpo(sevens_model_dir, dataset, settings, tmp_path / "merged", work_dir=tmp_path / "work", reward="vote_share")
    (step,) = [entry for entry in result.log_history if "reward" in entry]
    assert "rewards/vote_share_reward/mean" in step and 0.0 <= step["rewards/vote_share_reward/mean"] <= 1.0
    with pytest.raises(ValueError, match="reward 'soft'"):
        train_grpo(sevens_model_dir, dataset, settings, tmp_path / "other", work_dir=tmp_path / "w", reward="soft")
