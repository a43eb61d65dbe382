"""SFT: supervised fine-tuning on the teacher's samples that agree with the kept pseudo-label (no Dagster here).

TRL's `SFTTrainer` with the loss on the completion tokens only, and the same LoRA, resumable checkpoints,
non-finite step guard and merged, checked checkpoint as GRPO (`base.fit`). A step trains on `prompts_per_step`
problems x `num_generations` rows, the shape of a GRPO step: the rows keep each problem's group together in a
seeded order (`base.grouped_by_problem`), and the trainer reads them in order.
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

SFT_LOGGED = (("mean_token_accuracy", "mean_token_accuracy"),)
"""TRL's step logs summarised in `TrainingResult.metrics` (first and last quarter)."""


def build_sft_dataset(
    rows: pl.DataFrame, system_prompt: str, *, seed: int = 0, prompt_noise: bool = False
) -> datasets.Dataset:
    """`student_data.sft_rows` as TRL prompt-completion rows ("prompt": chat messages, "completion": the
    assistant turn), grouped by problem in a seeded order."""
    import datasets

    noise_seed = seed if prompt_noise else None
    return datasets.Dataset.from_list(
        [
            {
                "prompt": student_messages(row["problem_id"], row["prompt"], system_prompt, noise_seed),
                "completion": [{"role": "assistant", "content": row["completion"]}],
                "problem_id": row["problem_id"],
            }
            for row in grouped_by_problem(rows, seed).iter_rows(named=True)
        ]
    )


def train_sft(
    init_checkpoint: Path,
    dataset: datasets.Dataset,
    settings: GRPOSettings,
    out_dir: Path,
    *,
    work_dir: Path,
    device: str = "cpu",
    dtype: str = "float32",
    report_to: list[str] | None = None,
    callbacks: list | None = None,
    warn: Callable[[str], None] | None = None,
    model_dropout: float = 0.0,
) -> TrainingResult:
    """Supervised fine-tuning (loss on the completion tokens only) of `init_checkpoint` on `dataset`
    (`build_sft_dataset`), `settings.completions_per_step` rows a step; see `grpo.train_grpo` for
    resuming, guards and what is saved."""
    from trl import SFTConfig, SFTTrainer

    check_step_fits(dataset, settings.completions_per_step, "completions")
    model, tokenizer = load_policy(init_checkpoint, model_dropout)
    args = SFTConfig(
        **in_order_args(settings, settings.completions_per_step, work_dir, device, dtype, report_to),
        max_length=None,  # the teacher's samples are at most max_new_tokens long; nothing is cut
        completion_only_loss=True,
    )
    trainer_kwargs = dict(
        model=model,
        args=args,
        train_dataset=dataset.remove_columns("problem_id"),
        processing_class=tokenizer,
        peft_config=lora_config(settings) if settings.use_lora else None,
    )
    return fit(
        SFTTrainer,
        trainer_kwargs,
        tokenizer,
        settings.max_consecutive_skipped_steps,
        init_checkpoint,
        out_dir,
        work_dir=work_dir,
        callbacks=callbacks,
        warn=warn,
        what="SFT",
        label_sources=[PSEUDO] * len(dataset),
        logged=SFT_LOGGED,
    )
