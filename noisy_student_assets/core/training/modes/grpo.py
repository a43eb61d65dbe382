"""`grpo`: RL against the labels, the gold answers of the labeled problems and the kept pseudo-labels (or the
vote shares, `reward: vote_share`). Labeled RL and every control train this way too."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from noisy_student_assets.core.prompts import DEFAULT_SYSTEM_PROMPT
from noisy_student_assets.core.pseudo_labels.student_data import vote_share_table
from noisy_student_assets.core.settings import HARD_REWARD, VOTE_SHARE_REWARD
from noisy_student_assets.core.training.compute import grpo_compute
from noisy_student_assets.core.training.grpo import MajorityGate, build_training_dataset, train_grpo
from noisy_student_assets.core.training.modes.base import StudentData, StudentMode

if TYPE_CHECKING:
    import datasets

    from noisy_student_assets.core.settings import GRPOSettings, StudentSettings
    from noisy_student_assets.core.training.base import TrainingResult, TrainingRun
    from noisy_student_assets.core.training.compute import TrainingCompute


class GRPOMode(StudentMode):
    name = "grpo"
    description = "RL (TRL GRPOTrainer) on the labeled problems and the kept pseudo-labels"
    reads_reward = True

    def training_set(self, settings: StudentSettings, data: StudentData) -> datasets.Dataset:
        shares = None
        if settings.reward == VOTE_SHARE_REWARD:
            shares = vote_share_table(data.required("generations"), data.required("pseudo-labels"))
        return build_training_dataset(
            data.labeled,
            data.pseudo_labeled,
            DEFAULT_SYSTEM_PROMPT,
            seed=settings.grpo.seed,
            prompt_noise=settings.prompt_noise,
            vote_shares=shares,
            unlabeled_share=settings.unlabeled_share,
            prompts=settings.grpo.max_steps * settings.grpo.prompts_per_step,
        )

    def train(
        self, settings: StudentSettings, init_dir: Path, dataset: datasets.Dataset, out_dir: Path, run: TrainingRun
    ) -> TrainingResult:
        return train_grpo(
            init_dir,
            dataset,
            settings.grpo,
            out_dir,
            run,
            reward=settings.reward,
            majority_gate=MajorityGate(settings.vote_min_share, settings.vote_min_margin),
            model_dropout=settings.model_dropout,
        )

    def compute(self, result: TrainingResult, settings: GRPOSettings) -> TrainingCompute:
        return grpo_compute(
            result.log_history, int(result.metrics["steps"]), settings.prompts_per_step, settings.num_generations
        )

    def admits(self, control: str, settings: StudentSettings) -> bool:
        # the gold- and random-label controls' rows carry no mark of which problems were unlabeled, so they could not
        # keep the student's unlabeled share
        return super().admits(control, settings) or (
            settings.reward == HARD_REWARD and settings.unlabeled_share is None
        )
