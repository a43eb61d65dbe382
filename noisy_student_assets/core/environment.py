"""Every environment variable the project reads, in one place: its name, its default and what it switches.

Everything a run is made of is a setting (`settings.py`), so that it is recorded and fingerprinted; the environment
only says where things are and which deployment this is. `make setup` writes the profile, the lake and the database
to `.env`, which the dagster CLI and the grid read. No other module of the project reads the environment (a unit
test checks it); variables the project only passes on to the libraries it starts (vLLM's threads, MLflow's
printing) are set where they are started.
"""

from __future__ import annotations

import os
from pathlib import Path

PROFILE = "NOISY_STUDENT_PROFILE"
"""The settings profile, `cpu` (default) or `gpu`: every setting's default (`profiles.py`)."""
DATA_LAKE = "NOISY_STUDENT_DATA_LAKE"
"""Where the artifacts live (default `./data_lake`)."""
EXPERIMENTS = "NOISY_STUDENT_EXPERIMENTS"
"""The experiment files' directory (default: the repository's `experiments/`)."""
EXPLORER_URL = "NOISY_STUDENT_EXPLORER_URL"
"""Where the explorer (`make explore`) serves, for the links to it in the Dagster UI (default `http://127.0.0.1:7860`)."""
MLFLOW_URL = "NOISY_STUDENT_MLFLOW_URL"
"""Where `mlflow ui` serves the tracking store, for the links to its runs in the Dagster UI (default
`http://127.0.0.1:5000`, what `mlflow ui` serves unless told a --host or --port)."""
LAUNCHER = "NOISY_STUDENT_LAUNCHER"
"""The launcher kind of the code location's runs (the UI's, the CLI's, the daemon's); unset: the profile's. The grid's
`--launcher` and an experiment's `launcher:` still win for the grid's runs."""
RETRY_DELAY_S = "NOISY_STUDENT_RETRY_DELAY_S"
"""Seconds before a failed heavy step's retry (default 10: a moment for a dead device or payload to be cleaned up;
the tests set 0)."""
DEFAULTS_CHECK_INTERVAL_S = "NOISY_STUDENT_DEFAULTS_CHECK_INTERVAL_S"
"""Seconds between two evaluations of the current-defaults sensor (default 30: a reload shows as a warning within
about that; tests/ui/test_unsynced.py sets 5)."""
DATABASE_URL = "NOISY_STUDENT_DATABASE_URL"
"""A PostgreSQL database for the Dagster instance and MLflow's store (`resources/database.py`); unset: embedded
SQLite."""
ARM = "NOISY_STUDENT_ARM"
"""The arm the notebooks inspect (`notebooks/`; default `default`, the arm `make run` makes)."""
RAY_ADDRESS = "RAY_ADDRESS"
"""Ray's own: the cluster the ray launcher submits to, where the launcher's `ray_address` names none."""
FORWARDED_PREFIXES = ("NOISY_STUDENT_", "HF_", "TRANSFORMERS_", "VLLM_", "PYTHONPATH")
"""What a Ray job is given of the orchestrator's environment (a Ray worker does not inherit the submitter's)."""


def _read(name: str) -> str:
    return os.environ.get(name, "").strip()


def profile_name() -> str:
    return _read(PROFILE).lower() or "cpu"


def data_lake_root() -> Path:
    return Path(_read(DATA_LAKE) or "data_lake").expanduser().resolve()


def experiments_dir(default: Path) -> Path:
    return Path(_read(EXPERIMENTS) or default)


def inspected_arm(default: str) -> str:
    return _read(ARM) or default


def launcher_kind() -> str | None:
    return _read(LAUNCHER) or None


def retry_delay_s() -> float:
    return float(_read(RETRY_DELAY_S) or 10)


def defaults_check_interval_s() -> int:
    return int(_read(DEFAULTS_CHECK_INTERVAL_S) or 30)


def database_url() -> str | None:
    return _read(DATABASE_URL) or None


def explorer_url() -> str:
    return (_read(EXPLORER_URL) or "http://127.0.0.1:7860").rstrip("/")


def mlflow_url() -> str:
    return (_read(MLFLOW_URL) or "http://127.0.0.1:5000").rstrip("/")


def ray_address() -> str | None:
    return _read(RAY_ADDRESS) or None


def forwarded() -> dict[str, str]:
    """The orchestrator's variables a Ray job is given (`FORWARDED_PREFIXES`)."""
    return {name: value for name, value in os.environ.items() if name.startswith(FORWARDED_PREFIXES)}


def own_instance(dagster_home: Path, lake: Path) -> dict[str, str]:
    """The environment of a child process with a Dagster instance and a lake of its own: this process's, with
    `DAGSTER_HOME` and the lake replaced and without the shared database, whose instance would hold every home's
    runs."""
    inherited = {name: value for name, value in os.environ.items() if name != DATABASE_URL}
    return inherited | {"DAGSTER_HOME": str(dagster_home), DATA_LAKE: str(lake)}


def torchrun_rank() -> tuple[int, int]:
    """(this process's rank, the number of processes): torchrun's `RANK` and `WORLD_SIZE`; (0, 1) outside torchrun."""
    return int(_read("RANK") or 0), int(_read("WORLD_SIZE") or 1)


def visible_devices() -> str | None:
    """The accelerators a payload was given (`CUDA_VISIBLE_DEVICES`, set by Ray or the user)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")
