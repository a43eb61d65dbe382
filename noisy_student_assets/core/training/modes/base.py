"""What a student mode is (no Dagster here): from the round's data to a training set, a trained checkpoint and
the compute it spent, and which compute-matched controls it admits.

A mode is a subclass in a module of its own, listed in `registry.MODES`; nothing else dispatches on modes.
Every mode trains `settings.grpo.max_steps` steps of `prompts_per_step` problems x `num_generations`
completions, the shape of a GRPO step, so that a student of any mode and its labeled-only control spend the
same optimizer steps, prompts and completions (`compute_matched`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import polars as pl

from noisy_student_assets.core.layout import LABELED_ONLY
from noisy_student_assets.core.settings import HARD_REWARD
from noisy_student_assets.core.training.compute import supervised_compute

if TYPE_CHECKING:
    import datasets

    from noisy_student_assets.core.settings import GRPOSettings, StudentSettings
    from noisy_student_assets.core.training.base import TrainingResult, TrainingRun
    from noisy_student_assets.core.training.compute import TrainingCompute


@dataclass(frozen=True)
class StudentData:
    """What a student may train on: the labeled problems (with gold), the kept pseudo-labels within the agreement
    band (None for the labeled-only training of labeled RL and its control), and the teacher's samples."""

    labeled: pl.DataFrame
    pseudo_labeled: pl.DataFrame | None = None
    generations: pl.DataFrame | None = None
    validation: pl.DataFrame | None = None
    """The arm's validation problems, which a GRPO run with `grpo.validation_every` checks itself on (labeled RL's)."""

    def required(self, what: str) -> pl.DataFrame:
        frame = {"pseudo-labels": self.pseudo_labeled, "generations": self.generations}[what]
        if frame is None:
            raise ValueError(f"this student trains on the round's {what}, and none were given")
        return frame


class StudentMode(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    """One line for the configuration reference."""
    reads_reward: ClassVar[bool] = False
    """Whether the mode has a reward (`settings.reward`) to choose."""

    @abstractmethod
    def training_set(self, settings: StudentSettings, data: StudentData) -> datasets.Dataset:
        """The TRL dataset, with the student's prompt noise."""

    @abstractmethod
    def train(
        self, settings: StudentSettings, init_dir: Path, dataset: datasets.Dataset, out_dir: Path, run: TrainingRun
    ) -> TrainingResult:
        """Train from `init_dir` into `out_dir`, with the student's dropout noise (`settings.model_dropout`), over the
        one setup (`base.TrainerSetup`)."""

    def compute(self, result: TrainingResult, settings: GRPOSettings) -> TrainingCompute:
        """What a finished run spent (see `training.compute`): a mode that samples nothing while it trains (it trains
        on the teacher's samples) spends a GRPO step's prompts and completions a step."""
        return supervised_compute(int(result.metrics["steps"]), settings.prompts_per_step, settings.num_generations)

    def admits(self, control: str, settings: StudentSettings) -> bool:
        """Whether a round of this student can run beside `control`: the gold- and random-label controls train GRPO
        on 0/1 rewards against their labels, a counterpart only a GRPO student with the hard reward has."""
        return control == LABELED_ONLY

    def refusal(self, settings: StudentSettings) -> str | None:
        """Why `settings` do not fit this mode, or None."""
        if settings.reward != HARD_REWARD and not self.reads_reward:
            return f"reward {settings.reward!r} is a GRPO reward; mode {self.name!r} has none"
        if settings.unlabeled_share is not None and not self.reads_reward:
            return f"unlabeled_share sets a GRPO run's prompts; mode {self.name!r} trains on samples"
        if settings.grpo.stop_reward is not None and not self.reads_reward:
            return f"grpo.stop_reward stops on a GRPO run's answer reward; mode {self.name!r} logs none"
        return None
