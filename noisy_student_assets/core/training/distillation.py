"""The student's other training modes (no Dagster here): `sft`, supervised fine-tuning on the teacher's
samples that agree with the kept pseudo-label, and `dpo`, preference learning from the vote (the rows and
pairs come from `student_data`). Both are TRL trainers (`SFTTrainer`, `DPOTrainer`; Rafailov et al. 2023,
"Direct Preference Optimization") with the same LoRA, resumable checkpoints, non-finite step guard and
merged, checked checkpoint as GRPO (`training.fit`).

A step of either trains on `prompts_per_step` problems x `num_generations` completions (SFT rows, or DPO
pairs x 2), the shape of a GRPO step: the training sets keep each problem's rows together, the groups
shuffled by seed, and the trainers read them in order. So a student of any mode and its labeled-only
control spend the same optimizer steps, prompts and completions (GRPO alone also samples its completions).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from noisy_student_assets.core.training.grpo import (
    PSEUDO,
    GRPOSettings,
    TrainingResult,
    check_step_fits,
    fit,
    load_policy,
    lora_config,
    student_messages,
    trainer_args,
)

if TYPE_CHECKING:
    import datasets

SFT_LOGGED = (("mean_token_accuracy", "mean_token_accuracy"),)
DPO_LOGGED = (("rewards/accuracies", "preference_accuracy"), ("rewards/margins", "reward_margin"))
"""TRL's step logs summarised in `TrainingResult.metrics` (first and last quarter)."""


def _grouped(frame: pl.DataFrame, seed: int) -> pl.DataFrame:
    """`frame`'s rows with each problem's rows kept together, the problems in an order shuffled by `seed`."""
    problems = frame.select("problem_id").unique(maintain_order=True).sample(fraction=1.0, shuffle=True, seed=seed)
    order = problems.with_row_index("group")
    return frame.with_row_index("row").join(order, on="problem_id").sort("group", "row").drop("group", "row")


def build_sft_dataset(rows: pl.DataFrame, system_prompt: str, *, seed: int = 0, prompt_noise: bool = False) -> datasets.Dataset:
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
            for row in _grouped(rows, seed).iter_rows(named=True)
        ]
    )


def build_dpo_dataset(pairs: pl.DataFrame, system_prompt: str, *, seed: int = 0, prompt_noise: bool = False) -> datasets.Dataset:
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
            for row in _grouped(pairs, seed).iter_rows(named=True)
        ]
    )


def _in_order_args(settings: GRPOSettings, per_step: int, work_dir: Path, device: str, report_to: list[str] | None) -> dict:
    """`training.trainer_args`, reading the rows in order (the datasets hold each step's groups in order) and
    dropping an epoch's last, partial batch, so that every step trains on whole groups."""
    in_order = {"train_sampling_strategy": "sequential", "dataloader_drop_last": True}
    return trainer_args(settings, per_step, work_dir, device, report_to or ["none"]) | in_order


def train_sft(
    init_checkpoint: Path,
    dataset: datasets.Dataset,
    settings: GRPOSettings,
    out_dir: Path,
    *,
    work_dir: Path,
    device: str = "cpu",
    report_to: list[str] | None = None,
    callbacks: list | None = None,
    warn: Callable[[str], None] | None = None,
    model_dropout: float = 0.0,
) -> TrainingResult:
    """Supervised fine-tuning (loss on the completion tokens only) of `init_checkpoint` on `dataset`
    (`build_sft_dataset`), `settings.completions_per_step` rows a step; see `training.train_grpo` for
    resuming, guards and what is saved."""
    from trl import SFTConfig, SFTTrainer

    check_step_fits(dataset, settings.completions_per_step, "completions")
    model, tokenizer = load_policy(init_checkpoint, model_dropout)
    args = SFTConfig(
        **_in_order_args(settings, settings.completions_per_step, work_dir, device, report_to),
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
        SFTTrainer, trainer_kwargs, tokenizer, settings, init_checkpoint, out_dir,
        work_dir=work_dir, callbacks=callbacks, warn=warn, what="SFT", label_sources=[PSEUDO] * len(dataset), logged=SFT_LOGGED,
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
    report_to: list[str] | None = None,
    callbacks: list | None = None,
    warn: Callable[[str], None] | None = None,
    model_dropout: float = 0.0,
) -> TrainingResult:
    """DPO of `init_checkpoint` on `dataset` (`build_dpo_dataset`), `settings.completions_per_step / 2` pairs
    a step, against the init policy as reference (with LoRA: the model with its adapters off) at strength
    `beta`; see `training.train_grpo` for resuming, guards and what is saved."""
    from trl import DPOConfig, DPOTrainer

    if settings.completions_per_step % 2:
        raise ValueError(f"a DPO step trains on pairs: {settings.completions_per_step} completions a step is odd")
    pairs_per_step = settings.completions_per_step // 2
    check_step_fits(dataset, pairs_per_step, "pairs")
    model, tokenizer = load_policy(init_checkpoint, model_dropout)
    args = DPOConfig(**_in_order_args(settings, pairs_per_step, work_dir, device, report_to), beta=beta, max_length=None)
    trainer_kwargs = dict(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(settings) if settings.use_lora else None,
    )
    return fit(
        DPOTrainer, trainer_kwargs, tokenizer, settings, init_checkpoint, out_dir,
        work_dir=work_dir, callbacks=callbacks, warn=warn, what="DPO", label_sources=[PSEUDO] * len(dataset), logged=DPO_LOGGED,
    )
