"""Drives the `dagster` CLI in a subprocess, as a user would from a shell."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DAGSTER = str(Path(sys.executable).with_name("dagster"))
DAGSTER_DAEMON = str(Path(sys.executable).with_name("dagster-daemon"))


def changed_defaults_env(defaults: dict) -> dict[str, str]:
    """The environment variables of a process whose settings' defaults are changed as an edited `core/settings.py` would change
    them ({"TeacherSamplingSettings": {"k": 6}}; see tests/changed_defaults/sitecustomize.py)."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT / "tests" / "changed_defaults"), str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "NOISY_STUDENT_TEST_DEFAULTS": json.dumps(defaults)}


class DagsterCli:
    """Runs `dagster ...` in a scratch project directory with its own instance and data lake."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.lake = home / "data_lake"
        shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
        shutil.copy(REPO_ROOT / "workspace.yaml", home / "workspace.yaml")
        self.env = os.environ | {"DAGSTER_HOME": str(home), "NOISY_STUDENT_DATA_LAKE": str(self.lake)}

    def __call__(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [DAGSTER, *args], cwd=self.home, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert result.returncode == 0, f"dagster {' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        return result

    def start(self, *args: str, log: Path) -> subprocess.Popen:
        """`dagster ...` in the background, its output in `log`, in a process group of its own (see `stop`)."""
        with log.open("w") as out:
            return subprocess.Popen(
                [DAGSTER, *args], cwd=self.home, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def grid(self, experiment: Path, config: dict, log: Path, *options: str, env: dict | None = None) -> subprocess.Popen:
        """`python -m noisy_student_assets.grid run <experiment>` in the background, its output in `log`, in a process
        group of its own (a test may kill the whole grid)."""
        with log.open("w") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "noisy_student_assets.grid", "run", str(experiment), "--config-json", json.dumps(config), *options],
                cwd=self.home, env=self.env | (env or {}), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    @staticmethod
    def stop(process: subprocess.Popen, timeout: float = 60) -> None:
        """Stop a `start`ed command, then every process it started: `dagster dev` leaves its webserver, daemon
        and code server running when only it is stopped, and a whole group sent SIGTERM at once may hang."""
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # what it left behind, or all of it if it hung on the way out
        process.wait(timeout=timeout)
