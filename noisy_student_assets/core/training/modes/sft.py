"""`sft`: rejection sampling on consensus, i.e. fine-tuning on the teacher's own samples whose answer agrees with
the kept pseudo-label (RFT, Yuan et al. 2023; STaR, Zelikman et al. 2022, with the vote in place of the gold).

TRL's `SFTTrainer` with the loss on the completion tokens only, over the setup every trainer shares
(`base.TrainerSetup`: LoRA, resumable checkpoints, non-finite step guard and merged, checked checkpoint). A step
trains on `prompts_per_step` problems x `num_generations` rows, the shape of a GRPO step: the rows keep each
problem's group together in a seeded order (`base.grouped_by_problem`), and the trainer reads them in order.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from noisy_student_assets.core.prompts import DEFAULT_SYSTEM_PROMPT, student_messages
from noisy_student_assets.core.pseudo_labels.student_data import sft_rows
from noisy_student_assets.core.training.base import PSEUDO, Loss, Rows, TrainerSetup, grouped_by_problem
from noisy_student_assets.core.training.modes.base import StudentData, StudentMode

if TYPE_CHECKING:
    from datasets import Dataset

    from noisy_student_assets.core.settings import GRPOSettings, StudentSettings
    from noisy_student_assets.core.training.base import TrainingResult, TrainingRun

SFT_LOGGED = (("mean_token_accuracy", "mean_token_accuracy"),)
"""TRL's step logs summarised in `TrainingResult.metrics` (first and last quarter)."""


def build_sft_dataset(rows: pl.DataFrame, system_prompt: str, *, seed: int = 0, prompt_noise: bool = False) -> Dataset:
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
    dataset: Dataset,
    settings: GRPOSettings,
    out_dir: Path,
    run: TrainingRun,
    *,
    model_dropout: float = 0.0,
) -> TrainingResult:
    """Supervised fine-tuning (loss on the completion tokens only) of `init_checkpoint` on `dataset`
    (`build_sft_dataset`), `settings.completions_per_step` rows a step, over the one setup (`base.TrainerSetup`:
    resuming, guards and what is saved); `model_dropout` is the student's dropout noise."""
    from trl import SFTConfig, SFTTrainer

    # The teacher's samples are at most max_new_tokens long: nothing is cut.
    loss = Loss("SFT", SFTTrainer, SFTConfig, {"max_length": None, "completion_only_loss": True}, SFT_LOGGED)
    rows = Rows(settings.completions_per_step, "completions", PSEUDO, in_order=True)
    setup = TrainerSetup.for_student(settings, model_dropout)
    return setup.train(loss, rows, init_checkpoint, dataset.remove_columns("problem_id"), out_dir, run)


class SFTMode(StudentMode):
    name = "sft"
    description = (
        "fine-tune (TRL SFTTrainer) on the teacher's samples that agree with the kept pseudo-labels (RFT); "
        "pseudo-labeled problems only"
    )

    def training_set(self, settings: StudentSettings, data: StudentData) -> Dataset:
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
        self, settings: StudentSettings, init_dir: Path, dataset: Dataset, out_dir: Path, run: TrainingRun
    ) -> TrainingResult:
        return train_sft(init_dir, dataset, settings.grpo, out_dir, run, model_dropout=settings.model_dropout)
