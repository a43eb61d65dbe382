"""How a round's student trains, in each `StudentSettings.mode` (no Dagster here): its training set from the
labels, the teacher's samples and the student's noise, the trainer, and the compute it spent.

Noisy Student (Xie et al. 2020, "Self-training with Noisy Student improves ImageNet classification") trains
the student with noise the teacher never has: here dropout on the model and its LoRA adapters, and prompts
rendered through varied templates (`prompts.NOISY_TEMPLATES`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from noisy_student_assets.core.prompts import DEFAULT_SYSTEM_PROMPT
from noisy_student_assets.core.training.compute import TrainingCompute, grpo_compute, supervised_compute
from noisy_student_assets.core.training.grpo import HARD_REWARD, REWARDS, VOTE_SHARE_REWARD, GRPOSettings, TrainingResult

if TYPE_CHECKING:
    import datasets

GRPO_MODE, SFT_MODE, DPO_MODE = "grpo", "sft", "dpo"
STUDENT_MODES = (GRPO_MODE, SFT_MODE, DPO_MODE)
"""GRPO against the labels (`training.train_grpo`), or `distillation.train_sft` / `distillation.train_dpo` on
the teacher's samples that agree with the kept pseudo-labels."""


@dataclass(frozen=True)
class StudentSettings:
    """What a student trains with beyond the GRPO settings (which also set every mode's budget and LoRA)."""

    mode: str = GRPO_MODE
    reward: str = HARD_REWARD
    """GRPO's reward on pseudo-labeled rows: one of `training.REWARDS`."""
    prompt_noise: bool = False
    model_dropout: float = 0.0
    sft_samples_per_problem: int = 0
    """sft: distinct agreeing samples per problem (0: all), repeated to fill its group."""
    dpo_beta: float = 0.1

    def __post_init__(self) -> None:
        if self.mode not in STUDENT_MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {STUDENT_MODES}")
        if self.reward not in REWARDS:
            raise ValueError(f"reward {self.reward!r} is not one of {REWARDS}")
        if self.reward != HARD_REWARD and self.mode != GRPO_MODE:
            raise ValueError(f"reward {self.reward!r} is a GRPO reward; mode {self.mode!r} has none")
        if not 0.0 <= self.model_dropout < 1.0:
            raise ValueError(f"model_dropout must be within [0, 1), got {self.model_dropout}")

    def changed(self) -> dict:
        """The settings away from their defaults (what tells this student from a plain GRPO one)."""
        default = StudentSettings()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)}

    def as_dict(self) -> dict:
        return asdict(self)


def training_set(
    student: StudentSettings,
    seed: int,
    labeled: pl.DataFrame,
    pseudo_labeled: pl.DataFrame | None,
    generations: pl.DataFrame | None,
    group_size: int,
) -> datasets.Dataset:
    """The TRL dataset of `student.mode`: GRPO rows of the labeled and the kept pseudo-labeled problems (with
    vote shares for the soft reward), or SFT rows / DPO pairs of `group_size` completions per kept problem from
    the teacher's `generations`, with the student's prompt noise."""
    from noisy_student_assets.core.pseudo_labels.student_data import dpo_pairs, sft_rows, vote_share_table
    from noisy_student_assets.core.training.distillation import build_dpo_dataset, build_sft_dataset
    from noisy_student_assets.core.training.grpo import build_training_dataset

    noise = student.prompt_noise
    if student.mode == GRPO_MODE:
        shares = None
        if student.reward == VOTE_SHARE_REWARD:
            shares = vote_share_table(_required(generations, "generations"), _required(pseudo_labeled, "pseudo-labels"))
        return build_training_dataset(labeled, pseudo_labeled, DEFAULT_SYSTEM_PROMPT, seed=seed, prompt_noise=noise, vote_shares=shares)
    generations, pseudo_labeled = _required(generations, "generations"), _required(pseudo_labeled, "pseudo-labels")
    if student.mode == SFT_MODE:
        rows = sft_rows(generations, pseudo_labeled, group_size, student.sft_samples_per_problem)
        return build_sft_dataset(rows, DEFAULT_SYSTEM_PROMPT, seed=seed, prompt_noise=noise)
    pairs = dpo_pairs(generations, pseudo_labeled, max(1, group_size // 2))
    return build_dpo_dataset(pairs, DEFAULT_SYSTEM_PROMPT, seed=seed, prompt_noise=noise)


def _required(frame: pl.DataFrame | None, what: str) -> pl.DataFrame:
    if frame is None:
        raise ValueError(f"this student trains on the round's {what}, and none were given")
    return frame


def train_student(
    student: StudentSettings, init_dir: Path, dataset: datasets.Dataset, settings: GRPOSettings, out_dir: Path, **kwargs
) -> TrainingResult:
    """Train `dataset` (`training_set`) from `init_dir` in `student.mode` into `out_dir`; `kwargs` as
    `training.train_grpo` takes them (work_dir, device, report_to, callbacks, warn)."""
    from noisy_student_assets.core.training.distillation import train_dpo, train_sft
    from noisy_student_assets.core.training.grpo import train_grpo

    dropout = student.model_dropout
    if student.mode == GRPO_MODE:
        return train_grpo(init_dir, dataset, settings, out_dir, model_dropout=dropout, reward=student.reward, **kwargs)
    if student.mode == SFT_MODE:
        return train_sft(init_dir, dataset, settings, out_dir, model_dropout=dropout, **kwargs)
    return train_dpo(init_dir, dataset, settings, out_dir, beta=student.dpo_beta, model_dropout=dropout, **kwargs)


def student_compute(student: StudentSettings, result: TrainingResult, settings: GRPOSettings) -> TrainingCompute:
    """The compute a finished run spent (see `training_compute`)."""
    steps = int(result.metrics["steps"])
    if student.mode == GRPO_MODE:
        return grpo_compute(result.log_history, steps, settings.prompts_per_step, settings.num_generations)
    return supervised_compute(steps, settings.prompts_per_step, settings.num_generations)
