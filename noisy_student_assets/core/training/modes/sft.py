"""`sft`: rejection sampling on consensus, i.e. fine-tuning on the teacher's own samples whose answer agrees with
the kept pseudo-label (RFT, Yuan et al. 2023; STaR, Zelikman et al. 2022, with the vote in place of the gold)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from noisy_student_assets.core.prompts import DEFAULT_SYSTEM_PROMPT
from noisy_student_assets.core.pseudo_labels.student_data import sft_rows
from noisy_student_assets.core.training.modes.base import StudentData, StudentMode
from noisy_student_assets.core.training.sft import build_sft_dataset, train_sft

if TYPE_CHECKING:
    import datasets

    from noisy_student_assets.core.settings import StudentSettings
    from noisy_student_assets.core.training.base import TrainingResult, TrainingRun


class SFTMode(StudentMode):
    name = "sft"
    description = (
        "fine-tune (TRL SFTTrainer) on the teacher's samples that agree with the kept pseudo-labels (RFT); "
        "pseudo-labeled problems only"
    )

    def training_set(self, settings: StudentSettings, data: StudentData) -> datasets.Dataset:
        rows = sft_rows(
            data.required("generations"),
            data.required("pseudo-labels"),
            settings.grpo.num_generations,
            settings.sft_samples_per_problem,
        )
        return build_sft_dataset(
            rows, DEFAULT_SYSTEM_PROMPT, seed=settings.grpo.seed, prompt_noise=settings.prompt_noise
        )

    def train(
        self, settings: StudentSettings, init_dir: Path, dataset: datasets.Dataset, out_dir: Path, run: TrainingRun
    ) -> TrainingResult:
        return train_sft(init_dir, dataset, settings.grpo, out_dir, run, model_dropout=settings.model_dropout)
