"""The training stage (no Dagster here): a student of any mode, labeled RL and every control train through
here, from an init checkpoint and the round's data to a merged checkpoint with the compute it spent.

Noisy Student (Xie et al. 2020, "Self-training with Noisy Student improves ImageNet classification") trains
the student with noise the teacher never has: dropout on the model and its LoRA adapters (`model_dropout`,
`grpo.lora_dropout`), and prompts rendered through varied templates (`prompt_noise`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from noisy_student_assets.core.problems import fingerprint as problems_fingerprint
from noisy_student_assets.core.training.compute import TrainingCompute
from noisy_student_assets.core.training.modes.base import StudentData
from noisy_student_assets.core.training.modes.registry import student_mode_for

if TYPE_CHECKING:
    import datasets
    import polars as pl

    from noisy_student_assets.core.settings import ComputeSettings, StudentSettings
    from noisy_student_assets.core.training.base import TrainingResult, TrainingRun


def training_set(settings: StudentSettings, data: StudentData) -> datasets.Dataset:
    """The rows the student's mode trains on."""
    return student_mode_for(settings).training_set(settings, data)


def training_fingerprint(
    settings: StudentSettings,
    init_weights_sha256: str,
    dataset: datasets.Dataset,
    compute: ComputeSettings,
    validation: pl.DataFrame | None = None,
) -> str:
    """Everything that shapes a training run: TRL checkpoints of a crashed attempt are kept under it (a retry
    resumes the same run, a changed input never resumes a stale one), and an identical published run is found
    by it. Training options at their defaults are left out, so that a plain GRPO run keys as it did before they
    existed; the compute precision only when it is not float32; the `validation` problems only where a checked run
    (`grpo.validation_every`) reads them."""
    options = settings.changed()
    precision = [] if compute.dtype == "float32" else [{"dtype": compute.dtype}]
    identity = [
        settings.mode,
        init_weights_sha256,
        dataset.to_list(),
        settings.grpo.model_dump(),
        *([options] if options else []),
        *precision,
        *([{"validation": problems_fingerprint(validation)}] if validation is not None else []),
    ]
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def train_student(
    settings: StudentSettings, init_dir: Path, dataset: datasets.Dataset, out_dir: Path, run: TrainingRun
) -> tuple[TrainingResult, TrainingCompute]:
    """Train `dataset` (`training_set`) from `init_dir` in the settings' mode into `out_dir`, resuming from the
    TRL checkpoints in `run.work_dir`; the result and the compute it spent."""
    mode = student_mode_for(settings)
    result = mode.train(settings, init_dir, dataset, out_dir, run)
    return result, mode.compute(result, settings.grpo)
