"""GRPO's groups sampled by the project's vLLM engine loaded with the policy's weights at each step (`rollouts: vllm`),
in real TRL runs on the tiny "sevens" model (whose rewards vary within a group, so that a step moves the weights): the
loss is TRL's own on the same completions, and the engine samples from the weights the trainer holds at each step,
with LoRA and without."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback
from trl import GRPOTrainer

from noisy_student_assets.core.sampling import SAMPLING_KV_CACHE_BYTES
from noisy_student_assets.core.settings import TRL_ROLLOUTS, VLLM_ROLLOUTS
from noisy_student_assets.core.training import grpo, validation_stop
from noisy_student_assets.core.training.base import TrainingRun
from noisy_student_assets.core.training.grpo import build_training_dataset, train_grpo
from noisy_student_assets.core.training.rollouts import VllmRollouts
from noisy_student_assets.core.vllm_engine import kv_cache_bytes
from tests.training_data import SYSTEM_PROMPT, TINY_RUN, labeled_frame

LOGPROB_TOLERANCE = 1e-4
"""vLLM's float32 log-probs against the trainer's forward pass on the same tokens (the probe saw 0 to 1e-6)."""


def _settings(rollouts: str, steps: int):
    return TINY_RUN.model_copy(update=dict(save_steps=0, max_steps=steps, rollouts=rollouts, num_generations=8))


def _step_losses(log_history: list[dict]) -> list[float]:
    return [entry["loss"] for entry in log_history if "loss" in entry]


def test_a_step_sampled_by_vllm_has_trl_s_own_loss_on_the_same_completions(
    sevens_model_dir: Path, tmp_path: Path, monkeypatch
):
    dataset = build_training_dataset(labeled_frame(), None, SYSTEM_PROMPT)
    sampled: list[tuple[list, list]] = []
    engine_sample = VllmRollouts.sample

    def recorded(self, prompts, trainer):
        sampled.append(engine_sample(self, prompts, trainer))
        return sampled[-1]

    monkeypatch.setattr(VllmRollouts, "sample", recorded)
    with_vllm = train_grpo(
        sevens_model_dir, dataset, _settings(VLLM_ROLLOUTS, 1), tmp_path / "vllm", TrainingRun(tmp_path / "w1")
    )
    assert len(sampled) == 1
    prompt_ids, completion_ids = sampled[0]

    # TRL's own path (no rollout function), its generation handing back the completions vLLM sampled.
    def replayed(self, prompt_ids_in, images, multimodal_fields, num_generations, has_tool_images=False):
        assert prompt_ids_in == prompt_ids  # TRL tokenized the step's prompts as the rollout did
        return completion_ids, None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", replayed)
    with_trl = train_grpo(
        sevens_model_dir, dataset, _settings(TRL_ROLLOUTS, 1), tmp_path / "trl", TrainingRun(tmp_path / "w2")
    )
    vllm_loss, trl_loss = _step_losses(with_vllm.log_history), _step_losses(with_trl.log_history)
    assert len(vllm_loss) == len(trl_loss) == 1
    assert math.isfinite(vllm_loss[0]) and vllm_loss[0] != 0.0  # a step that carried a gradient
    assert vllm_loss[0] == pytest.approx(trl_loss[0], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("use_lora", [True, False], ids=["lora", "every-weight"])
def test_the_engine_samples_from_the_trainer_s_weights_at_each_step(
    sevens_model_dir: Path, tmp_path: Path, monkeypatch, use_lora: bool
):
    """At each step's sampling, the log-probs the engine gives a sequence it sampled are the trainer's own at that
    moment; and the trainer's moved between the steps, so step 0's weights would not do. The sequence's prompt was
    sampled at step 0 too, so keys and values cached then would fail it."""
    from vllm import SamplingParams

    dataset = build_training_dataset(labeled_frame(), None, SYSTEM_PROMPT)
    probes: list[dict] = []
    cache_bytes: list[tuple[int, int]] = []
    engine_sample = VllmRollouts.sample

    def probed(self, prompts, trainer):
        prompt_ids, completion_ids = engine_sample(self, prompts, trainer)
        sequence = prompt_ids[0] + completion_ids[0]
        step = trainer.state.global_step
        scored = self._engine.generate([sequence], SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0))[
            0
        ].prompt_logprobs
        engine = torch.tensor([scored[index][token].logprob for index, token in enumerate(sequence) if index])
        trainer_logprobs = _sequence_logprobs(trainer.model, sequence)
        probes.append({"step": step, "sequence": sequence, "engine": engine, "trainer": trainer_logprobs})
        config = self._engine.llm.llm_engine.vllm_config
        cache_bytes.append(
            (
                config.cache_config.kv_cache_memory_bytes,
                kv_cache_bytes(trainer.model.config, "float32", len(prompt_ids), config.model_config.max_model_len),
            )
        )
        return prompt_ids, completion_ids

    monkeypatch.setattr(VllmRollouts, "sample", probed)
    settings = _settings(VLLM_ROLLOUTS, 2).model_copy(update={"use_lora": use_lora})
    result = train_grpo(sevens_model_dir, dataset, settings, tmp_path / "merged", TrainingRun(tmp_path / "w"))
    assert [probe["step"] for probe in probes] == [0, 1]
    # the engine's KV cache is a step's groups', not the sampling stage's 2 GiB
    assert all(engine == step for engine, step in cache_bytes) and cache_bytes[0][0] < SAMPLING_KV_CACHE_BYTES / 8
    for probe in probes:
        assert (probe["engine"] - probe["trainer"]).abs().max() < LOGPROB_TOLERANCE, probe["step"]
    assert _step_losses(result.log_history)[0] != 0.0  # step 0 carried a gradient
    # The weights moved: step 1's sequence scored by the initial weights (the engine's before any load) differs from
    # what the trainer held at step 1.
    base = _base_logprobs(sevens_model_dir, probes[1]["sequence"])
    assert (base - probes[1]["trainer"]).abs().max() > 100 * LOGPROB_TOLERANCE


def _base_logprobs(checkpoint: Path, sequence: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    return _sequence_logprobs(AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32), sequence)


def _sequence_logprobs(model, sequence: list[int]) -> torch.Tensor:
    """The log-probability `model` gives each token of `sequence` after the first."""
    with torch.no_grad():
        logits = model(torch.tensor([sequence])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(sequence[1:])[:, None])[:, 0]


class _StopAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step


def test_a_run_whose_validation_stalls_stops_and_keeps_its_best_check_s_weights(
    sevens_model_dir: Path, tmp_path: Path, monkeypatch
):
    """Checked every step with a patience of 2, accuracies 0.2, 0.5, 0.4, 0.3 stop the run at step 4 of 6 and keep
    step 2's weights: those of the same run stopped at step 2 (the same schedule). Each check generated a greedy
    answer to every validation problem through the run's engine; only the accuracies are scripted."""
    dataset = build_training_dataset(labeled_frame(), None, SYSTEM_PROMPT)
    validation = labeled_frame(3).with_columns(pl.col("problem_id").str.replace("gold", "validation"))
    scripted, graded = iter([0.2, 0.5, 0.4, 0.3]), []

    def accuracy(completions: list[str], gold: list[str]) -> float:
        graded.append(completions)
        return next(scripted)

    monkeypatch.setattr(validation_stop, "greedy_accuracy", accuracy)
    settings = _settings(VLLM_ROLLOUTS, 6).model_copy(
        update={"validation_every": 1, "validation_patience": 2, "save_steps": 1}
    )
    checked = train_grpo(
        sevens_model_dir, dataset, settings, tmp_path / "checked", TrainingRun(tmp_path / "w1", validation=validation)
    )
    assert checked.metrics["steps"] == 4
    assert [len(completions) for completions in graded] == [3] * 4
    assert all(isinstance(text, str) for completions in graded for text in completions)
    assert grpo.stop_reason(checked.log_history, settings, 4).startswith(
        "validation stalled: greedy accuracy 0.500 at step 2 not beaten in 2 checks, to step 4 of at most 6; kept "
        "step 2's weights"
    )
    unchecked = settings.model_copy(update={"validation_every": 0})
    stopped = train_grpo(
        sevens_model_dir,
        dataset,
        unchecked,
        tmp_path / "stopped",
        TrainingRun(tmp_path / "w2", callbacks=(_StopAt(2),)),
    )
    assert stopped.metrics["steps"] == 2
    kept, expected = (load_file(run.checkpoint_dir / "model.safetensors") for run in (checked, stopped))
    assert kept.keys() == expected.keys()
    for name, weights in expected.items():
        torch.testing.assert_close(kept[name], weights, msg=name)


def test_a_checked_run_needs_its_validation_problems(sevens_model_dir: Path, tmp_path: Path):
    dataset = build_training_dataset(labeled_frame(), None, SYSTEM_PROMPT)
    settings = _settings(VLLM_ROLLOUTS, 1).model_copy(update={"validation_every": 8})
    with pytest.raises(ValueError, match="validation_every is set, but the run is given no validation problems"):
        train_grpo(sevens_model_dir, dataset, settings, tmp_path / "out", TrainingRun(tmp_path / "w"))
