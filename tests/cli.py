"""Drives the `dagster` CLI in a subprocess, as a user would from a shell."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dagster as dg

REPO_ROOT = Path(__file__).resolve().parents[1]
DAGSTER = str(Path(sys.executable).with_name("dagster"))
DAGSTER_DAEMON = str(Path(sys.executable).with_name("dagster-daemon"))
FAULTHANDLER = {"PYTHONFAULTHANDLER": "1"}
"""A grid's environment: SIGABRT (`DagsterCli.finish`) prints where each of its threads is."""


def grid_command(action: str, experiment: Path, config: dict | None = None, *options: str) -> list[str]:
    """The command line of `python -m noisy_student_assets.grid <action> <experiment>` (with `config` as its
    `--config-json`), for a process of its own."""
    config_json = ["--config-json", json.dumps(config)] if config is not None else []
    return [sys.executable, "-m", "noisy_student_assets.grid", action, str(experiment), *config_json, *options]


def changed_defaults_env(defaults: dict | None = None, file: Path | None = None) -> dict[str, str]:
    """The environment variables of a process whose settings' defaults are changed as an edited `core/settings.py`
    would change them: by `defaults` ({"TeacherSamplingSettings": {"k": 6}}), or by what `file` holds when a process
    starts (see tests/changed_defaults/sitecustomize.py)."""
    path = os.pathsep.join(
        filter(None, [str(REPO_ROOT / "tests" / "changed_defaults"), str(REPO_ROOT), os.environ.get("PYTHONPATH")])
    )
    changes = {"NOISY_STUDENT_TEST_DEFAULTS": json.dumps(defaults)} if defaults is not None else {}
    return {"PYTHONPATH": path} | changes | ({"NOISY_STUDENT_TEST_DEFAULTS_FILE": str(file)} if file else {})


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
        assert result.returncode == 0, (
            f"dagster {' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
        return result

    def start(self, *args: str, log: Path) -> subprocess.Popen:
        """`dagster ...` in the background, its output in `log`, in a process group of its own (see `stop`)."""
        with log.open("w") as out:
            return subprocess.Popen(
                [DAGSTER, *args],
                cwd=self.home,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @contextlib.contextmanager
    def dev(self, timeout: float = 180) -> Iterator[str]:
        """`dagster dev` (webserver and daemon) on 127.0.0.1, once the webserver has loaded the code location: its
        base URL; stopped on exit."""
        port = free_port()
        log = self.home / "dagster-dev.log"
        process = self.start("dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port), log=log)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_loaded(url, process, log, timeout)
            yield url
        finally:
            self.stop(process)

    def grid(
        self, experiment: Path, config: dict, log: Path, *options: str, env: dict | None = None
    ) -> subprocess.Popen:
        """`python -m noisy_student_assets.grid run <experiment>` in the background, its output in `log`, in a process
        group of its own (a test may kill the whole grid)."""
        with log.open("w") as out:
            return subprocess.Popen(
                grid_command("run", experiment, config, *options),
                cwd=self.home,
                env=self.env | FAULTHANDLER | (env or {}),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def run_grid(
        self, action: str, experiment: Path, config: dict | None = None, *options: str, env: dict | None = None
    ) -> subprocess.CompletedProcess:
        """`python -m noisy_student_assets.grid <action> <experiment>` in the home, to its end; its output captured."""
        command = grid_command(action, experiment, config, *options)
        return subprocess.run(
            command, cwd=self.home, env=self.env | (env or {}), capture_output=True, text=True, timeout=900
        )

    def grid_done(self, experiment: Path, config: dict, log: Path, *options: str, env: dict | None = None) -> str:
        """`grid` run to its end (it must succeed); its output."""
        process = self.grid(experiment, config, log, *options, env=env)
        assert self.finish(process, log, 900) == 0, log.read_text()[-3000:]
        return log.read_text()

    def enter(self, monkeypatch) -> None:
        """Work in the home, as a grid run there does, with its instance's storage already created."""
        monkeypatch.chdir(self.home)  # dagster.yaml's storage paths are relative to the working directory
        with dg.DagsterInstance.from_config(str(self.home)):
            pass  # its SQLite storage is made here, not by a test and the grid at once (two schema migrations racing)

    @staticmethod
    def finish(process: subprocess.Popen, log: Path, timeout: float) -> int:
        """The exit status of a `grid` process; one still running after `timeout` fails the test with the stack of
        each of its threads (faulthandler prints them to the log on SIGABRT), which says where it hung."""
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            stacks = log.read_text().split("\nExtension modules:")[0]  # faulthandler's list of them says nothing
            raise AssertionError(
                f"the grid still ran after {timeout:.0f} s; its log ends:\n{stacks[-12000:]}"
            ) from None

    @staticmethod
    def stop(process: subprocess.Popen, timeout: float = 60) -> None:
        """Stop a `start`ed command and every process it started as a terminal's Ctrl-C does, an interrupt to its
        whole process group (tests/e2e/test_dagster_dev.py: `dagster dev` then stops its webserver, daemon and code
        server itself); what is left after `timeout` is killed. With SIGTERM to the command alone, `dagster dev` and
        the explorer ran until the timeout."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # what it left behind, or all of it if it hung on the way out
        process.wait(timeout=timeout)


def materializing(log: Path, arm: str) -> str:
    """The line of a grid's output that lists what it materialized for `arm`."""
    (line,) = [line for line in log.read_text().splitlines() if line.startswith(f"[grid] arm {arm}: materializing")]
    return line


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now, for a server a test starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_serving(url: str, process: subprocess.Popen, log: Path, timeout: float) -> None:
    """Until `url` answers 200; the server `process` (its output in `log`) must not exit, nor take `timeout` s."""
    deadline = time.monotonic() + timeout
    while not _serving(url):
        assert process.poll() is None, f"{process.args[0]} exited:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"{url} did not answer in {timeout} s:\n{log.read_text()[-4000:]}"
        time.sleep(1)


def _serving(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def own_device_lock(cli: DagsterCli) -> dict:
    """The grid's environment with a temporary directory of its own, where its device lock lives: its steps must not
    queue behind another test's heavy steps, or a pipeline's on this machine (the lock is per machine)."""
    return {"TMPDIR": str(cli.home)}


def graphql(url: str, query: str, variables: dict | None = None) -> dict:
    """The `data` of a query to the webserver at `url` (what the UI sends)."""
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(f"{url}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["data"]


def wait_until_loaded(url: str, process: subprocess.Popen, log: Path, timeout: float) -> None:
    """Until the webserver at `url` has loaded the code location; `dagster dev` (`process`, its output in `log`) must
    not exit, nor take `timeout` s."""
    deadline = time.monotonic() + timeout
    while not _code_location_loaded(url):
        assert process.poll() is None, f"dagster dev exited:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, (
            f"the UI did not load the code location in {timeout} s:\n{log.read_text()[-4000:]}"
        )
        time.sleep(2)


def _code_location_loaded(url: str) -> bool:
    try:
        return bool(graphql(url, "{ assetNodes { id } }")["assetNodes"])
    except (OSError, KeyError, TypeError):
        return False


def run_failures(instance: dg.DagsterInstance, records) -> str:
    """The error messages of failed runs (of a backfill, say), so a test that fails on them says why."""
    failed = (dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE)
    return "\n".join(
        f"{record.dagster_run.tags.get('dagster/partition')}: {event.message}{_error_of(event.dagster_event)}"
        for record in records
        for event in instance.all_logs(record.dagster_run.run_id)
        if event.dagster_event and event.dagster_event.event_type in failed
    )


def _error_of(event) -> str:
    """A step failure's error (the event's message only names the step)."""
    error = event.step_failure_data.error if event.event_type == dg.DagsterEventType.STEP_FAILURE else None
    return f" {error.cls_name}: {error.message.strip()}" if error else ""
