"""`make ui` (`dagster dev -w workspace.yaml`) stops on one Ctrl-C, and no process of it is left."""

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.cli import DAGSTER, DagsterCli, free_port, wait_until_loaded

pytestmark = pytest.mark.e2e

# Below dagster dev's own wait for its webserver and daemon, after which it kills them and still exits 0.
STOP_LIMIT_S = 30


def _as_from_a_terminal() -> None:
    """A terminal's shell starts a command with SIGINT at its default; a background job of a script inherits it
    ignored, and then no interrupt stops dagster dev."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _command_line(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.NoSuchProcess:
        return []


def test_one_interrupt_stops_dagster_dev_with_its_code_server(tmp_path: Path) -> None:
    cli = DagsterCli(tmp_path)
    port = free_port()
    log = tmp_path / "dagster-dev.log"
    with log.open("w") as out:
        dev = subprocess.Popen(
            [DAGSTER, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
            cwd=cli.home,
            env=cli.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_as_from_a_terminal,
        )
    started: list[psutil.Process] = []
    try:
        wait_until_loaded(f"http://127.0.0.1:{port}", dev, log, timeout=300)
        started = psutil.Process(dev.pid).children(recursive=True)
        assert any("code-server" in _command_line(process) for process in started)

        os.killpg(dev.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground process group
        try:
            status = dev.wait(timeout=STOP_LIMIT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"one interrupt did not stop dagster dev:\n{log.read_text()[-3000:]}") from None
        assert status == 0, log.read_text()[-3000:]
        assert "did not terminate cleanly" not in log.read_text()
        _, alive = psutil.wait_procs(started, timeout=5)
        assert [" ".join(_command_line(process)[:4]) for process in alive] == []
    finally:
        DagsterCli.stop(dev)
