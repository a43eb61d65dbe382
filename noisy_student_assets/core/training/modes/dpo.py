"""`dpo`: preference learning from the votes, a sample agreeing with the majority preferred over one that does
not, the least-voted answers first (ScPO, Prasad et al. 2024, "Self-Consistency Preference Optimization")."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from noisy_student_assets.core.prompts import DEFAULT_SYSTEM_PROMPT
from noisy_student_assets.core.pseudo_labels.student_data import dpo_pairs
from noisy_student_assets.core.training.dpo import build_dpo_dataset, train_dpo
from noisy_student_assets.core.training.modes.base import StudentData, StudentMode

if TYPE_CHECKING:
    import datasets

    from noisy_student_assets.core.settings import StudentSettings
    from noisy_student_assets.core.training.base import TrainingResult, TrainingRun


class DPOMode(StudentMode):
    name = "dpo"
    description = (
        "DPO (TRL DPOTrainer): an agreeing sample preferred over a dissenting one (ScPO); pseudo-labeled problems only"
    )

    def training_set(self, settings: StudentSettings, data: StudentData) -> datasets.Dataset:
        pairs = dpo_pairs(
            data.required("generations"), data.required("pseudo-labels"), max(1, settings.grpo.num_generations // 2)
        )
        return build_dpo_dataset(
            pairs, DEFAULT_SYSTEM_PROMPT, seed=settings.grpo.seed, prompt_noise=settings.prompt_noise
        )

    def train(
        self, settings: StudentSettings, init_dir: Path, dataset: datasets.Dataset, out_dir: Path, run: TrainingRun
    ) -> TrainingResult:
        return train_dpo(
            init_dir, dataset, settings.grpo, out_dir, run, beta=settings.dpo_beta, model_dropout=settings.model_dropout
        )
