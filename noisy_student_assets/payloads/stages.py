"""The heavy stages a payload runs (no Dagster here): each calls one core function, writes its output where the
spec says and returns a small JSON-ready result. A `Reporter` carries logs and TRL's step metrics out: into the
Dagster run log directly (in process) or through Dagster Pipes (`__main__`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import polars as pl

from noisy_student_assets.core.reporting.eval_report import GREEDY_FILE, SAMPLED_FILE
from noisy_student_assets.core.training.base import TrainingRun, step_logs_callback
from noisy_student_assets.payloads.specs import EvalSpec, SampleSpec, ScoreSpec, TrainSpec, VerifierSpec

if TYPE_CHECKING:
    from noisy_student_assets.core.settings import ComputeSettings

ERROR, RESULT, STEP, SET_ASIDE = "error", "result", "step", "set_aside"
"""The keys of the custom messages a payload sends through Pipes: its failure, its result, one step's logs, a partial
file of a killed attempt it moved aside."""
TIMING = "timing"
"""In a payload's result: seconds from the interpreter's start to `main` (`startup_seconds`) and in the stage
(`stage_seconds`), when the stage began and ended (`started_at`, `finished_at`), the host and its
CUDA_VISIBLE_DEVICES."""


class Reporter(Protocol):
    report_to: Sequence[str]
    """transformers' logging integrations of a trainer ("mlflow" in process; "none" where step metrics travel as
    messages, for the orchestrator alone writes to the tracking store)."""

    def info(self, message: str) -> None: ...

    def warning(self, message: str) -> None: ...

    def step(self, step: int, max_steps: int, logs: dict[str, float]) -> None:
        """TRL's logs of one optimizer step."""

    def set_aside(self, message: str) -> None:
        """A partial file or checkpoint a killed attempt left, moved aside (`core.resumable`): a warning, and a line
        of the asset's `set_aside` metadata."""


def sample(spec: SampleSpec, reporter: Reporter) -> dict:
    from noisy_student_assets.core.sampling import SampleShards, sample_teacher

    generations, resumed = sample_teacher(
        Path(spec.teacher_dir),
        pl.read_parquet(spec.problems),
        spec.settings,
        SampleShards(Path(spec.work_dir), reporter.set_aside),
        spec.compute,
        progress=lambda done, total: reporter.info(f"sampled {done}/{total} problems"),
        checkpoint_label=spec.checkpoint_label,
    )
    generations.write_parquet(spec.output)
    return {"resumed_problems": resumed}


def _training_run(work_dir: str, compute: ComputeSettings, reporter: Reporter) -> TrainingRun:
    """A training stage's trainer: checkpointing into `work_dir`, on `compute`'s device and precision, its step logs
    and warnings to `reporter`."""
    return TrainingRun(
        Path(work_dir),
        device=compute.resolved_device(),
        dtype=compute.dtype,
        report_to=tuple(reporter.report_to),
        callbacks=(step_logs_callback(reporter.step),),
        warn=reporter.warning,
        set_aside=reporter.set_aside,
    )


def train(spec: TrainSpec, reporter: Reporter) -> dict:
    import datasets

    from noisy_student_assets.core.training.student import train_student

    dataset = datasets.Dataset.from_list(json.loads(Path(spec.dataset).read_text()))
    run = _training_run(spec.work_dir, spec.compute, reporter)
    if spec.validation is not None:
        run = replace(run, validation=pl.read_parquet(spec.validation))
    result, spent = train_student(spec.settings, Path(spec.init_dir), dataset, Path(spec.output_dir), run)
    return {"metrics": result.metrics, "compute": spent.as_dict()}


def evaluate(spec: EvalSpec, reporter: Reporter) -> dict:
    from noisy_student_assets.core.evaluation import eval_completions

    greedy, sampled, resumed = eval_completions(
        Path(spec.checkpoint_dir),
        pl.read_parquet(spec.problems),
        spec.settings,
        spec.compute,
        Path(spec.work_dir),
        progress=lambda done, total: reporter.info(f"eval: {done}/{total} problem passes (greedy, then sampled)"),
        set_aside=reporter.set_aside,
    )
    output = Path(spec.output_dir)
    greedy.write_parquet(output / GREEDY_FILE)
    sampled.write_parquet(output / SAMPLED_FILE)
    return {"resumed_passes": resumed}


def verifier(spec: VerifierSpec, reporter: Reporter) -> dict:
    from noisy_student_assets.core.training.verifier import build_verifier

    metrics = build_verifier(
        Path(spec.teacher_dir),
        pl.read_parquet(spec.labeled),
        pl.read_parquet(spec.validation),
        spec.settings,
        spec.compute,
        Path(spec.output_dir),
        _training_run(spec.work_dir, spec.compute, reporter),
        progress=reporter.info,
    )
    return {"metrics": metrics}


def score(spec: ScoreSpec, reporter: Reporter) -> dict:
    from noisy_student_assets.core.training.verifier import score_round

    scores = score_round(Path(spec.verifier_dir), pl.read_parquet(spec.samples), spec.compute)
    scores.write_parquet(spec.output)
    reporter.info(f"scored {scores.height} samples")
    return {"samples": scores.height}


STAGES = {"sample": sample, "train": train, "evaluate": evaluate, "verifier": verifier, "score": score}


def run(spec: SampleSpec | TrainSpec | EvalSpec | VerifierSpec | ScoreSpec, reporter: Reporter) -> dict:
    """Run the stage `spec` names."""
    return STAGES[spec.stage](spec, reporter)
