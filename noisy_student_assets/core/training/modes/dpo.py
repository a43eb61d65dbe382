"""`dpo`: preference learning from the votes, a sample agreeing with the majority preferred over one that does
not, the least-voted answers first (ScPO, Prasad et al. 2024, "Self-Consistency Preference Optimization").

TRL's `DPOTrainer` (Rafailov et al. 2023, "Direct Preference Optimization") on (agreeing, dissenting) sample
pairs, over the setup every trainer shares (`base.TrainerSetup`: LoRA, resumable checkpoints, non-finite step
guard and merged, checked checkpoint). A step trains on `prompts_per_step` problems x `num_generations / 2`
pairs, i.e. the completions of a GRPO step; the pairs keep each problem's group together in a seeded order, read
in order.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from noisy_student_assets.core.prompts import DEFAULT_SYSTEM_PROMPT, student_messages
from noisy_student_assets.core.pseudo_labels.student_data import dpo_pairs
from noisy_student_assets.core.training.base import PSEUDO, Loss, Rows, TrainerSetup, grouped_by_problem
from noisy_student_assets.core.training.modes.base import StudentData, StudentMode

if TYPE_CHECKING:
    from datasets import Dataset

    from noisy_student_assets.core.settings import GRPOSettings, StudentSettings
    from noisy_student_assets.core.training.base import TrainingResult, TrainingRun

DPO_LOGGED = (("rewards/accuracies", "preference_accuracy"), ("rewards/margins", "reward_margin"))
"""TRL's step logs summarised in `TrainingResult.metrics` (first and last quarter)."""


def build_dpo_dataset(pairs: pl.DataFrame, system_prompt: str, *, seed: int = 0, prompt_noise: bool = False) -> Dataset:
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
    dataset: Dataset,
    settings: GRPOSettings,
    out_dir: Path,
    run: TrainingRun,
    *,
    beta: float,
    model_dropout: float = 0.0,
) -> TrainingResult:
    """DPO of `init_checkpoint` on `dataset` (`build_dpo_dataset`), `settings.completions_per_step / 2` pairs
    a step, against the init policy as reference (with LoRA: the model with its adapters off) at strength
    `beta`, over the one setup (`base.TrainerSetup`: resuming, guards and what is saved); `model_dropout` is the
    student's dropout noise."""
    from trl import DPOConfig, DPOTrainer

    if settings.completions_per_step % 2:
        raise ValueError(f"a DPO step trains on pairs: {settings.completions_per_step} completions a step is odd")
    loss = Loss("DPO", DPOTrainer, DPOConfig, {"beta": beta, "max_length": None}, DPO_LOGGED)
    rows = Rows(settings.completions_per_step // 2, "pairs", PSEUDO, in_order=True)
    return TrainerSetup.for_student(settings, model_dropout).train(loss, rows, init_checkpoint, dataset, out_dir, run)


class DPOMode(StudentMode):
    name = "dpo"
    description = (
        "DPO (TRL DPOTrainer): an agreeing sample preferred over a dissenting one (ScPO); pseudo-labeled problems only"
    )

    def training_set(self, settings: StudentSettings, data: StudentData) -> Dataset:
        pairs = dpo_pairs(
            data.required("generations"), data.required("pseudo-labels"), max(1, settings.grpo.num_generations // 2)
        )
        return build_dpo_dataset(
            pairs, DEFAULT_SYSTEM_PROMPT, seed=settings.grpo.seed, prompt_noise=settings.prompt_noise
        )

    def train(
        self, settings: StudentSettings, init_dir: Path, dataset: Dataset, out_dir: Path, run: TrainingRun
    ) -> TrainingResult:
        return train_dpo(
            init_dir, dataset, settings.grpo, out_dir, run, beta=settings.dpo_beta, model_dropout=settings.model_dropout
        )
