"""A lake's results, apart from its checkpoints and samples (no Dagster here): the small files the run summary,
the verdict's intervals and the headroom table read, copied in the lake's own layout into a directory that can be
committed beside the results page (`results/`). The summary reads such a directory as it reads a lake
(`python -m noisy_student_assets.summary --lake results/<name>`), so a reader without the lake prints the page's
tables, and seeds run on different days or machines pool by copying their results into one directory: the arms
are partitions, their files never collide.

What is kept, per arm: every evaluation's metrics, per-problem scores and report tables (not its completions), the
base model's among them, each round's pseudo-label audit, frontier and settings (not the labels' table), the
verifier's measures and its validation samples' scores (they judge it informative or not, and are small), the
held-out problems and the unlabeled problems (their ids say which held-out problems a test-time arm trained on),
each trained checkpoint's compute and training log (not its weights), and the hours the grid's runs of the arm took.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from noisy_student_assets.core import layout
from noisy_student_assets.core.promotion import PROMOTION_FILE
from noisy_student_assets.core.reporting.eval_report import GREEDY_FILE, SAMPLED_FILE
from noisy_student_assets.core.training.verifier import VALIDATION_SCORES_FILE, VERIFIER_METRICS_FILE

ARM_EVAL_ASSETS = (layout.BASE_MODEL_EVAL, layout.LABELED_RL_EVAL, layout.LABELED_RL_VALIDATION)
ROUND_EVAL_ASSETS = (
    layout.EVAL_REPORT,
    layout.STUDENT_VALIDATION,
    *(layout.control_eval(control) for control in layout.CONTROLS),
)
TABLE_ASSETS = (layout.EVAL_PROBLEMS, layout.UNLABELED_PROBLEMS)
ROUND_CHECKPOINTS = (layout.STUDENT, *(layout.control_checkpoint(control) for control in layout.CONTROLS))
CHECKPOINT_FILES = (layout.COMPUTE_FILE, layout.TRAINING_LOG_FILE)
COMPLETIONS = (GREEDY_FILE, SAMPLED_FILE)


def result_files(lake: Path, arms: list[str]) -> list[Path]:
    """The files of `arms` that a results directory keeps, as paths relative to `lake`."""
    directories = []
    for arm in arms:
        directories += [
            layout.artifact_dir(lake, name, arm)
            for name in (*ARM_EVAL_ASSETS, *TABLE_ASSETS, layout.LABELED_RL, layout.GRID_RUNS)
        ]
        for round_dir in sorted(lake.glob(f"{layout.ROUND_PREFIX}*")):
            directories += [
                round_dir / name / arm
                for name in (
                    *ROUND_EVAL_ASSETS,
                    *ROUND_CHECKPOINTS,
                    layout.TEACHER,
                    layout.PSEUDO_LABELS,
                    layout.VERIFIER,
                )
            ]
    files = []
    for directory in directories:
        if not directory.is_dir():
            continue
        asset = directory.parent.name if directory.name in arms else directory.name
        files += [path for path in sorted(directory.iterdir()) if path.is_file() and _kept(asset, path.name)]
    return [path.relative_to(lake) for path in files]


def _kept(asset: str, file_name: str) -> bool:
    if asset in (*ARM_EVAL_ASSETS, *ROUND_EVAL_ASSETS):
        return file_name.endswith((".json", ".parquet")) and file_name not in COMPLETIONS
    if asset == layout.PSEUDO_LABELS:
        return file_name.endswith(".json")
    if asset == layout.VERIFIER:
        return file_name in (VERIFIER_METRICS_FILE, VALIDATION_SCORES_FILE)
    if asset in (layout.LABELED_RL, *ROUND_CHECKPOINTS):
        return file_name in CHECKPOINT_FILES
    if asset == layout.TEACHER:
        return file_name == PROMOTION_FILE
    if asset == layout.GRID_RUNS:
        return file_name == layout.GRID_HOURS_FILE
    return asset in TABLE_ASSETS and file_name == layout.TABLE_FILE_NAME


def export_results(lake: Path, arms: list[str], destination: Path) -> list[Path]:
    """Copy the result files of `arms` from `lake` into `destination` in the same layout (what was there of other
    arms stays); the files copied, relative to both."""
    files = result_files(lake, arms)
    for relative in files:
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lake / relative, target)
    return files
