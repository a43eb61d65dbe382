"""Where the experiment files are (no Dagster here): the repository's `experiments/`, or the directory
`NOISY_STUDENT_EXPERIMENTS` names. Read by the arms, the tasks declared beside them and every command that lists
experiments."""

from __future__ import annotations

from pathlib import Path

from noisy_student_assets.core import environment

SHIPPED_EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"
"""The repository's `experiments/`."""


def default_experiments_dir() -> Path:
    """`NOISY_STUDENT_EXPERIMENTS`, else the repository's `experiments/`."""
    return environment.experiments_dir(SHIPPED_EXPERIMENTS)
