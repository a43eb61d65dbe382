"""`make ui` (`dagster dev -w workspace.yaml`) stops on one Ctrl-C, and no process of it is left."""

import os
import signal
from pathlib import Path

import psutil

from tests.cli import DagsterCli, free_port, wait_until_loaded

STOP_LIMIT_S = 60


def test_one_interrupt_stops_dagster_dev_with_its_code_server(tmp_path: Path) -> None:
    cli = DagsterCli(tmp_path)
    port = free_port()
    log = tmp_path / "dagster-dev.log"
    dev = cli.start("dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port), log=log)
    started: list[psutil.Process] = []
    try:
        wait_until_loaded(f"http://127.0.0.1:{port}", dev, log, timeout=300)
        started = psutil.Process(dev.pid).children(recursive=True)
        assert any("code-server" in process.cmdline() for process in started)

        os.killpg(dev.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground process group
        assert dev.wait(timeout=STOP_LIMIT_S) == 0, log.read_text()[-3000:]
        _, alive = psutil.wait_procs(started, timeout=5)
        assert [" ".join(process.cmdline()[:4]) for process in alive] == []
    finally:
        DagsterCli.stop(dev)
