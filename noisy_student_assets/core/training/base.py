"""What every trainer of the project shares (no Dagster here): loading the policy, TRL's training arguments,
LoRA, the guarded and resumable fit, and the merged, checked checkpoint it saves. GRPO (`grpo.py`), SFT
(`sft.py`) and DPO (`dpo.py`) are TRL trainers beside it, as TRL's own `{method}_trainer.py` sit beside its base.

The ML libraries are imported inside the functions that use them, so that loading the code location (which
imports the settings) does not wait for torch, peft and TRL.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    import datasets
    from peft import LoraConfig, PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from noisy_student_assets.core.settings import GRPOSettings

GOLD, PSEUDO = "gold", "pseudo"
"""Where a training row's target comes from: a gold answer, or a pseudo-label (or the teacher's samples)."""

DROPOUT_ATTRIBUTES = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout")
"""Model-config dropout probabilities across transformers architectures (Llama and Qwen2 have attention_dropout)."""

LOGGING_STEPS = 1
"""TRL logs every step: the compute accounting reads each step's completion lengths from the log."""


@dataclass(frozen=True)
class TrainingResult:
    checkpoint_dir: Path
    """Merged, self-contained checkpoint: safetensors weights, tokenizer and chat template, no adapters."""
    metrics: dict[str, float]
    """Final metrics: train_loss, train_runtime, steps (the global step reached), resumed_from_step,
    skipped_steps (optimizer steps of this call skipped for a non-finite loss or gradient norm),
    seconds_per_step (NaN when the checkpoint resumed from had already reached max_steps), and the first- and
    last-quarter means of the trainer's logged metrics (`fit`'s `logged`)."""
    log_history: list[dict]
    """`trainer.state.log_history`, including the steps of a checkpoint resumed from."""
    n_train_rows: int
    n_gold_rows: int
    n_pseudo_rows: int


def check_step_fits(dataset: datasets.Dataset, per_step: int, what: str) -> None:
    """Raise ValueError when `dataset` is empty or smaller than one optimizer step's `per_step` rows."""
    if len(dataset) == 0:
        raise ValueError("no training rows")
    if len(dataset) < per_step:
        # The Trainer's sampler drops incomplete batches, so a smaller set would yield no step at all.
        raise ValueError(f"{len(dataset)} training rows cannot fill a step of {per_step} {what}")


def trainer_args(
    settings: GRPOSettings, per_step: int, work_dir: Path, device: str, dtype: str, report_to: list[str]
) -> dict:
    """The TrainingArguments every trainer's TRL config shares: `per_step` rows an optimizer step (split over the
    accumulation steps and the processes, so that a step trains the same rows on any number), mixed precision when `dtype` (the compute precision) is bfloat16 or float16 over float32
    weights, checkpoints into `work_dir` every `save_steps` (only the latest is kept: resuming needs no other, and
    full fine-tune checkpoints hold optimiser state)."""
    return dict(
        output_dir=str(work_dir),
        max_steps=settings.max_steps,
        per_device_train_batch_size=per_step // (settings.gradient_accumulation_steps * settings.processes),
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        learning_rate=settings.learning_rate,
        seed=settings.seed,
        save_strategy="steps" if settings.save_steps > 0 else "no",
        save_steps=settings.save_steps,
        save_total_limit=1,
        bf16=dtype == "bfloat16",  # explicit: TRL turns bf16 on when it is left unset
        fp16=dtype == "float16",
        gradient_checkpointing=settings.gradient_checkpointing,
        logging_steps=LOGGING_STEPS,
        report_to=report_to,
        use_cpu=device == "cpu",
    )


def in_order_args(
    settings: GRPOSettings, per_step: int, work_dir: Path, device: str, dtype: str, report_to: list[str] | None
) -> dict:
    """`trainer_args`, reading the rows in order (`grouped_by_problem` holds each step's groups in order) and
    dropping an epoch's last, partial batch, so that every step trains on whole groups."""
    in_order = {"train_sampling_strategy": "sequential", "dataloader_drop_last": True}
    return trainer_args(settings, per_step, work_dir, device, dtype, report_to or ["none"]) | in_order


def grouped_by_problem(frame: pl.DataFrame, seed: int) -> pl.DataFrame:
    """`frame`'s rows with each problem's rows kept together, the problems in an order shuffled by `seed`."""
    problems = frame.select("problem_id").unique(maintain_order=True).sample(fraction=1.0, shuffle=True, seed=seed)
    order = problems.with_row_index("group")
    return frame.with_row_index("row").join(order, on="problem_id").sort("group", "row").drop("group", "row")


def lora_config(settings: GRPOSettings) -> LoraConfig:
    from peft import LoraConfig

    return LoraConfig(
        task_type="CAUSAL_LM",
        r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=list(settings.lora_target_modules),
    )


def load_policy(init_checkpoint: Path, model_dropout: float = 0.0) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The float32 model and tokenizer to train. `model_dropout` > 0 sets every dropout probability the
    model's config has (the student's model noise, Xie et al. 2020); `fit` saves the checkpoint with the
    init's dropout again, so a student never passes its noise on as a teacher."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(init_checkpoint)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = AutoConfig.from_pretrained(init_checkpoint)
    if model_dropout:
        if not 0.0 < model_dropout < 1.0:
            raise ValueError(f"model_dropout must be within [0, 1), got {model_dropout}")
        names = [name for name in DROPOUT_ATTRIBUTES if hasattr(config, name)]
        if not names:
            raise ValueError(f"{type(config).__name__} has none of {DROPOUT_ATTRIBUTES}: model_dropout cannot apply")
        for name in names:
            setattr(config, name, model_dropout)
    model = AutoModelForCausalLM.from_pretrained(
        init_checkpoint, config=config, dtype=torch.float32, use_safetensors=True
    )
    return model, tokenizer


def fit(
    trainer_class: type,
    trainer_kwargs: dict,
    tokenizer: PreTrainedTokenizerBase,
    max_consecutive_skipped_steps: int,
    init_checkpoint: Path,
    out_dir: Path,
    *,
    work_dir: Path,
    callbacks: list | None,
    warn: Callable[[str], None] | None,
    what: str,
    label_sources: list[str],
    logged: tuple[tuple[str, str], ...],
) -> TrainingResult:
    """Train a TRL trainer (`trainer_class(**trainer_kwargs)`, its args checkpointing into `work_dir`) from
    `init_checkpoint` with the non-finite step guard (failing after `max_consecutive_skipped_steps` in a row), resuming
    from the latest checkpoint in `work_dir`;
    save the merged model into `out_dir` and check its weights are finite. `logged` maps log keys to the names
    whose first- and last-quarter means the metrics report."""
    from transformers import AutoConfig
    from transformers.trainer_utils import get_last_checkpoint

    from noisy_student_assets.core.training.guards import (
        assert_finite_checkpoint,
        guarded_trainer_class,
        step_guard_callback,
    )

    guard = step_guard_callback(max_consecutive_skipped_steps, warn)
    trainer = guarded_trainer_class(trainer_class)(**trainer_kwargs, callbacks=[guard, *(callbacks or [])])
    resume_from = get_last_checkpoint(work_dir) if work_dir.is_dir() else None
    resumed_from_step = int(Path(resume_from).name.split("-")[-1]) if resume_from else 0
    train_output = trainer.train(resume_from_checkpoint=resume_from)
    if trainer.accelerator.is_main_process:  # one writer of the checkpoint when several processes train
        model = trainer.accelerator.unwrap_model(trainer.model)
        init_config = AutoConfig.from_pretrained(init_checkpoint)
        for name in DROPOUT_ATTRIBUTES:  # the noise was the student's: the checkpoint (a teacher next) has the init's
            if hasattr(init_config, name):
                setattr(model.config, name, getattr(init_config, name))
        save_merged(model, tokenizer, out_dir)
        assert_finite_checkpoint(out_dir, f"{what} from {init_checkpoint}")
    log_history = list(trainer.state.log_history)
    metrics = _final_metrics(train_output.metrics, log_history, trainer.state.global_step, resumed_from_step, logged)
    return TrainingResult(
        checkpoint_dir=out_dir,
        metrics=metrics | {"skipped_steps": float(len(guard.state.skipped_steps))},
        log_history=log_history,
        n_train_rows=len(label_sources),
        n_gold_rows=label_sources.count(GOLD),
        n_pseudo_rows=label_sources.count(PSEUDO),
    )


def save_merged(model: PreTrainedModel | PeftModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    """Save the trained policy as a plain checkpoint: LoRA adapters merged in, so no peft is needed to load it."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        model = model.merge_and_unload()
    model.config.use_cache = True  # the Trainer turns the KV cache off for training; inference wants it
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _final_metrics(
    train_metrics: dict[str, float],
    log_history: list[dict],
    global_step: int,
    resumed_from_step: int,
    logged: tuple[tuple[str, str], ...],
) -> dict[str, float]:
    trained_steps = global_step - resumed_from_step
    metrics = {
        "train_loss": train_metrics["train_loss"],
        "train_runtime": train_metrics["train_runtime"],
        "steps": float(global_step),
        "resumed_from_step": float(resumed_from_step),
        "seconds_per_step": train_metrics["train_runtime"] / trained_steps if trained_steps else math.nan,
    }
    for key, name in logged:
        values = [entry[key] for entry in log_history if key in entry]
        if values:
            quarter = max(1, len(values) // 4)
            metrics[f"{name}_first_quarter"] = sum(values[:quarter]) / quarter
            metrics[f"{name}_last_quarter"] = sum(values[-quarter:]) / quarter
    return metrics
