"""What a payload is given (no Dagster here): a spec per heavy stage, written as JSON by the orchestrator and read
back by the payload. Every path is one the payload's machine sees (on a cluster: a shared filesystem)."""

from __future__ import annotations

from typing import Annotated, Literal

import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from noisy_student_assets.core.settings import (
    ComputeSettings,
    EvalSettings,
    LauncherSettings,
    StudentSettings,
    TeacherSamplingSettings,
    VerifierSettings,
)


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    compute: ComputeSettings
    work_dir: str
    """Resumable state of this run (sample shards, TRL checkpoints): a retry of the same run finds it there."""

    @property
    def processes(self) -> int:
        return 1

    def work(self) -> tuple[int, int]:
        """The optimizer steps it trains and the completions it generates, which its time limit scales with."""
        return 0, 0

    def time_limit_s(self, launcher: LauncherSettings) -> float:
        """Seconds the stage may run (`launcher.time_limit_*`)."""
        steps, samples = self.work()
        return (
            launcher.time_limit_base_s
            + steps * launcher.time_limit_per_step_s
            + samples * launcher.time_limit_per_sample_s
        )


def _rows(problems: str) -> int:
    return pl.scan_parquet(problems).select(pl.len()).collect().item()


class SampleSpec(_Spec):
    """The teacher's K samples of each problem, written to `output` (parquet)."""

    stage: Literal["sample"] = "sample"
    teacher_dir: str
    problems: str
    settings: TeacherSamplingSettings
    checkpoint_label: str
    output: str

    def work(self) -> tuple[int, int]:
        return 0, _rows(self.problems) * self.settings.k


class TrainSpec(_Spec):
    """A training run from `init_dir` on the rows of `dataset` (JSON, as the orchestrator fingerprinted them), the
    merged checkpoint written into `output_dir`."""

    stage: Literal["train"] = "train"
    init_dir: str
    dataset: str
    validation: str | None = None
    """The problems (parquet, with their gold) a run with `grpo.validation_every` checks itself on."""
    settings: StudentSettings
    output_dir: str

    @property
    def processes(self) -> int:
        return self.settings.grpo.processes

    def work(self) -> tuple[int, int]:
        return self.settings.grpo.max_steps, 0


class EvalSpec(_Spec):
    """An evaluation's greedy and sampled completions, written into `output_dir` (`greedy.parquet`,
    `sampled.parquet`)."""

    stage: Literal["evaluate"] = "evaluate"
    checkpoint_dir: str
    problems: str
    settings: EvalSettings
    output_dir: str

    def work(self) -> tuple[int, int]:
        return 0, _rows(self.problems) * (1 + self.settings.samples)  # a greedy completion and the sampled ones


class VerifierSpec(_Spec):
    """A round's verifier: the teacher's samples of the labeled and validation problems (parquet, with their gold),
    the reward model trained on the labeled ones and measured on the others, written into `output_dir`."""

    stage: Literal["verifier"] = "verifier"
    teacher_dir: str
    labeled: str
    validation: str
    settings: VerifierSettings
    output_dir: str

    def work(self) -> tuple[int, int]:
        return self.settings.max_steps, (_rows(self.labeled) + _rows(self.validation)) * self.settings.k


class ScoreSpec(_Spec):
    """The verifier's score of each sample of `samples` (parquet: problem_id, sample_index, prompt, completion),
    written to `output` (parquet)."""

    stage: Literal["score"] = "score"
    verifier_dir: str
    samples: str
    output: str

    def work(self) -> tuple[int, int]:
        return 0, _rows(self.samples)  # a forward pass each, far cheaper than generating one


class StageSpec(BaseModel):
    """Any stage's spec, told apart by `stage`."""

    spec: Annotated[SampleSpec | TrainSpec | EvalSpec | VerifierSpec | ScoreSpec, Field(discriminator="stage")]
