"""GRPO training: short real TRL/peft runs on a tiny model (no mocks)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from noisy_student_assets.core.lake_reader import TrainedCheckpoint
from noisy_student_assets.core.reporting import plots
from noisy_student_assets.core.settings import GRPOSettings
from noisy_student_assets.core.training import grpo
from noisy_student_assets.core.training.base import TrainerSetup, TrainingRun
from noisy_student_assets.core.training.grpo import build_training_dataset, logged_completions, train_grpo
from tests.training_data import SYSTEM_PROMPT, TINY_RUN, labeled_frame, pseudo_frame


@pytest.fixture(scope="module")
def training_set():
    return build_training_dataset(labeled_frame(), pseudo_frame(), SYSTEM_PROMPT)


@pytest.fixture(scope="module")
def lora_run(sevens_model_dir: Path, training_set, tmp_path_factory: pytest.TempPathFactory):
    """Two LoRA steps, checkpointed every step; the resume test continues from its work dir."""
    root = tmp_path_factory.mktemp("lora_run")
    result = train_grpo(sevens_model_dir, training_set, TINY_RUN, root / "merged", TrainingRun(root / "work"))
    return result, root / "work"


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
    # the checkpoint keeps the steps' rewards, which the headroom table reads for the reward's saturation
    assert TrainedCheckpoint(result.checkpoint_dir).step_rewards == [
        entry["rewards/answer_reward/mean"] for entry in step_logs
    ]


def test_resume_continues_from_the_latest_checkpoint(lora_run, sevens_model_dir: Path, training_set, tmp_path: Path):
    _, work_dir = lora_run
    assert [path.name for path in work_dir.glob("checkpoint-*")] == ["checkpoint-2"]
    result = train_grpo(
        sevens_model_dir,
        training_set,
        TINY_RUN.model_copy(update=dict(max_steps=3)),
        tmp_path / "merged",
        TrainingRun(work_dir),
    )
    assert result.metrics["resumed_from_step"] == 2 and result.metrics["steps"] == 3
    assert [entry["step"] for entry in result.log_history if "reward" in entry] == [1, 2, 3]
    assert (work_dir / "checkpoint-3").is_dir()


class KilledAfterSaving(TrainerCallback):
    """Stops a run once it saved `step`'s checkpoint whole, as a kill in the next step's save would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt


def test_a_checkpoint_cut_short_in_its_save_is_set_aside_and_the_run_ends_as_an_uninterrupted_one(
    sevens_model_dir: Path, training_set, tmp_path: Path
):
    """checkpoint-3 as a kill in TRL's save leaves it (the adapter written, `training_args.bin` empty, no trainer
    state, optimizer or scheduler): the run resumes from the whole checkpoint-2 and ends with the weights of a run
    never stopped."""
    settings = TINY_RUN.model_copy(update=dict(max_steps=3))
    uninterrupted = train_grpo(
        sevens_model_dir, training_set, settings, tmp_path / "whole", TrainingRun(tmp_path / "w")
    )
    work_dir = tmp_path / "work"
    with pytest.raises(KeyboardInterrupt):
        train_grpo(
            sevens_model_dir,
            training_set,
            settings,
            tmp_path / "-",
            TrainingRun(work_dir, callbacks=(KilledAfterSaving(2),)),
        )
    cut_short = work_dir / "checkpoint-3"
    cut_short.mkdir()
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json"):
        shutil.copy(work_dir / "checkpoint-2" / name, cut_short / name)
    (cut_short / "training_args.bin").touch()
    told: list[str] = []
    resumed = train_grpo(
        sevens_model_dir, training_set, settings, tmp_path / "merged", TrainingRun(work_dir, set_aside=told.append)
    )
    assert resumed.metrics["resumed_from_step"] == 2 and resumed.metrics["steps"] == 3
    assert len(told) == 1 and told[0].startswith("checkpoint-3 was incomplete (no optimizer.pt, no scheduler.pt, no ")
    assert told[0].endswith("resumed from checkpoint-2")
    expected = load_file(uninterrupted.checkpoint_dir / "model.safetensors")
    trained = load_file(resumed.checkpoint_dir / "model.safetensors")
    assert expected.keys() == trained.keys()
    for name, weights in expected.items():
        torch.testing.assert_close(trained[name], weights, msg=name)


def test_a_run_with_a_stopping_rule_stops_once_its_reward_s_mean_reaches_it(
    sevens_model_dir: Path, training_set, tmp_path: Path
):
    """A threshold every mean meets (0) stops the run after its first window, within a budget of 5 steps; the steps
    it took are what its compute counts, and its stop reason says why."""
    settings = TINY_RUN.model_copy(update=dict(max_steps=5, stop_reward=0.0, stop_window=2, save_steps=0))
    result = train_grpo(sevens_model_dir, training_set, settings, tmp_path / "merged", TrainingRun(tmp_path / "work"))
    assert result.metrics["steps"] == 2
    assert len(TrainedCheckpoint(result.checkpoint_dir).step_rewards) == 2
    assert grpo.stop_reason(result.log_history, settings, 2) == (
        "labels learned: the answer reward's 2-step mean reached 0.0 at step 2 of at most 5"
    )


def test_full_fine_tune_changes_untargeted_weights(sevens_model_dir: Path, training_set, tmp_path: Path):
    settings = TINY_RUN.model_copy(update=dict(max_steps=1, use_lora=False, save_steps=0))
    result = train_grpo(sevens_model_dir, training_set, settings, tmp_path / "merged", TrainingRun(tmp_path / "work"))
    initial = load_file(sevens_model_dir / "model.safetensors")
    trained = load_file(result.checkpoint_dir / "model.safetensors")
    assert not torch.equal(initial["lm_head.weight"], trained["lm_head.weight"])  # LoRA would not touch it
    assert not list((tmp_path / "work").glob("checkpoint-*"))


def test_grpo_trains_on_the_vote_share_reward(sevens_model_dir: Path, tmp_path: Path):
    shares = pl.DataFrame(
        {"problem_id": [f"pseudo-{i}" for i in range(4)], "vote_shares": '[["7", 0.75], ["8", 0.25]]'}
    )
    dataset = build_training_dataset(labeled_frame(), pseudo_frame(), SYSTEM_PROMPT, vote_shares=shares)
    settings = TINY_RUN.model_copy(update=dict(max_steps=1, save_steps=0))
    result = train_grpo(
        sevens_model_dir, dataset, settings, tmp_path / "merged", TrainingRun(tmp_path / "work"), reward="vote_share"
    )
    (step,) = [entry for entry in result.log_history if "reward" in entry]
    assert "rewards/vote_share_reward/mean" in step and 0.0 <= step["rewards/vote_share_reward/mean"] <= 1.0
    with pytest.raises(ValueError, match="reward 'soft'"):
        train_grpo(sevens_model_dir, dataset, settings, tmp_path / "other", TrainingRun(tmp_path / "w"), reward="soft")


def test_the_logged_groups_are_the_step_s_completions_with_their_rewards_and_advantages(
    sevens_model_dir: Path, training_set, tmp_path: Path
):
    settings = TINY_RUN.model_copy(update=dict(max_steps=1, save_steps=0))
    run = TrainingRun(tmp_path / "work")
    result = train_grpo(sevens_model_dir, training_set, settings, tmp_path / "merged", run, log_completions=True)
    logged = logged_completions(tmp_path / "work")
    assert logged.height == settings.completions_per_step and set(logged["step"]) == {1}
    assert logged.group_by("question").len()["len"].to_list() == [settings.num_generations] * settings.prompts_per_step
    (step,) = [entry for entry in result.log_history if "reward" in entry]
    assert logged["answer_reward"].mean() == pytest.approx(step["reward"])
    assert (
        logged.group_by("question").agg(pl.col("advantage").sum())["advantage"].abs().max() < 1e-4
    )  # relative to the group's mean
    assert plots.grpo_groups(logged).startswith(b"\x89PNG")


def test_each_step_trains_on_prompts_per_step_groups(tmp_path: Path):
    settings = GRPOSettings(
        num_generations=4, prompts_per_step=3, gradient_accumulation_steps=2, format_reward_weight=0.5, save_steps=0
    )
    config = TrainerSetup.for_student(settings).config(
        grpo.grpo_loss(settings), grpo.grpo_rows(settings), TrainingRun(tmp_path)
    )
    assert config.per_device_train_batch_size * config.gradient_accumulation_steps == 12
    assert config.generation_batch_size == 12 and config.steps_per_generation == 2
    assert config.reward_weights == [1.0, 0.5]
    assert config.bf16 is False and config.use_cpu is True and config.save_strategy == "no"


@pytest.mark.parametrize(("n_rows", "message"), [(0, "no training rows"), (1, "cannot fill a step of 2 prompts")])
def test_too_small_a_dataset_is_rejected_before_loading(tmp_path: Path, training_set, n_rows: int, message: str):
    too_small = training_set.select(range(n_rows))
    with pytest.raises(ValueError, match=message):
        train_grpo(tmp_path / "no-model", too_small, TINY_RUN, tmp_path / "out", TrainingRun(tmp_path / "work"))


def test_a_checked_run_resumed_after_its_stall_stays_stopped_and_a_saved_best_drops_the_earlier_bests(tmp_path) -> None:
    """A run saved at its stalled check and resumed stops at once (transformers clears the stop as training begins);
    an earlier best check's weights go only once a checkpoint whose log names the later best is saved."""
    import polars as pl
    from transformers import TrainerControl, TrainerState

    from noisy_student_assets.core.training.validation_stop import (
        BEST_WEIGHTS,
        VALIDATION_LOGGED,
        validation_stop_callback,
    )

    problems = pl.DataFrame({"problem_id": ["p0"], "prompt": ["What is 1 + 1?"], "gold_answer": ["2"]})
    callback = validation_stop_callback(8, 2, problems, engine=None, work_dir=tmp_path)
    accuracies = {8: 0.4, 16: 0.6, 24: 0.7, 32: 0.65, 40: 0.6}
    early, stalled_run = TrainerState(global_step=16, max_steps=96), TrainerState(global_step=40, max_steps=96)
    early.log_history = [{"step": step, VALIDATION_LOGGED: accuracies[step]} for step in (8, 16)]
    stalled_run.log_history = [{"step": step, VALIDATION_LOGGED: accuracy} for step, accuracy in accuracies.items()]
    controls = {name: TrainerControl() for name in ("early", "stalled")}
    callback.on_train_begin(None, early, controls["early"])
    callback.on_train_begin(None, stalled_run, controls["stalled"])
    assert not controls["early"].should_training_stop and controls["stalled"].should_training_stop
    for step in (16, 24):
        (tmp_path / BEST_WEIGHTS.format(step=step)).write_bytes(b"weights")
    callback.on_save(None, early, controls["early"])
    assert len(list(tmp_path.iterdir())) == 2, "step 16's checkpoint does not know step 24's check"
    callback.on_save(None, stalled_run, controls["stalled"])
    assert [path.name for path in tmp_path.iterdir()] == [BEST_WEIGHTS.format(step=24)]
