"""DPO: preference learning from the teacher's votes (no Dagster here).

TRL's `DPOTrainer` (Rafailov et al. 2023, "Direct Preference Optimization") on (agreeing, dissenting) sample
pairs, with the same LoRA, resumable checkpoints, non-finite step guard and merged, checked checkpoint as GRPO
(`base.fit`). A step trains on `prompts_per_step` problems x `num_generations / 2` pairs, i.e. the completions
of a GRPO step; the pairs keep each problem's group together in a seeded order, read in order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from noisy_student_assets.core.prompts import student_messages
from noisy_student_assets.core.training.base import (
    PSEUDO,
    TrainingResult,
    check_step_fits,
    fit,
    grouped_by_problem,
    in_order_args,
    load_policy,
    lora_config,
)

if TYPE_CHECKING:
    import datasets

    from noisy_student_assets.core.settings import GRPOSettings

DPO_LOGGED = (("rewards/accuracies", "preference_accuracy"), ("rewards/margins", "reward_margin"))
"""TRL's step logs summarised in `TrainingResult.metrics` (first and last quarter)."""


def build_dpo_dataset(
    pairs: pl.DataFrame, system_prompt: str, *, seed: int = 0, prompt_noise: bool = False
) -> datasets.Dataset:
    """`student_data.dpo_pairs` as TRL conversational preference rows ("prompt", "chosen", "rejected"),
    grouped by problem in a seeded order."""
    import datasets

    noise_seed = seed if prompt_noise else None
    return datasets.Dataset.from_list(
        [
            {
                "prompt": student_messages(row["problem_id"], row["prompt"], system_prompt, noise_seed),
                "chosen": [{"role": "assistant", "content": row["chosen"]}],
                "rejected": [{"role": "assistant", "content": row["rejected"]}],
            }
            for row in grouped_by_problem(pairs, seed).iter_rows(named=True)
        ]
    )


def train_dpo(
    init_checkpoint: Path,
    dataset: datasets.Dataset,
    settings: GRPOSettings,
    out_dir: Path,
    *,
    beta: float,
    work_dir: Path,
    device: str = "cpu",
    dtype: str = "float32",
    report_to: list[str] | None = None,
    callbacks: list | None = None,
    warn: Callable[[str], None] | None = None,
    model_dropout: float = 0.0,
) -> TrainingResult:
    """DPO of `init_checkpoint` on `dataset` (`build_dpo_dataset`), `settings.completions_per_step / 2` pairs
    a step, against the init policy as reference (with LoRA: the model with its adapters off) at strength
    `beta`; see `grpo.train_grpo` for resuming, guards and what is saved."""
    from trl import DPOConfig, DPOTrainer

    if settings.completions_per_step % 2:
        raise ValueError(f"a DPO step trains on pairs: {settings.completions_per_step} completions a step is odd")
    pairs_per_step = settings.completions_per_step // 2
    if pairs_per_step % (settings.gradient_accumulation_steps * settings.processes):
        raise ValueError(
            f"{pairs_per_step} pairs a step cannot be split over {settings.gradient_accumulation_steps * settings.processes} micro-batches"
        )
    check_step_fits(dataset, pairs_per_step, "pairs")
    model, tokenizer = load_policy(init_checkpoint, model_dropout)
    args = DPOConfig(
        **in_order_args(settings, pairs_per_step, work_dir, device, dtype, report_to), beta=beta, max_length=None
    )
    trainer_kwargs = dict(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(settings) if settings.use_lora else None,
    )
    return fit(
        DPOTrainer,
        trainer_kwargs,
        tokenizer,
        settings.max_consecutive_skipped_steps,
        init_checkpoint,
        out_dir,
        work_dir=work_dir,
        callbacks=callbacks,
        warn=warn,
        what="DPO",
        label_sources=[PSEUDO] * len(dataset),
        logged=DPO_LOGGED,
    )
