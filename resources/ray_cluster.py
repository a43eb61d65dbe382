"""A Ray cluster on this machine alone, started and stopped by whoever needs one: the grid when the `ray` launcher
has no `RAY_ADDRESS` to go to, and the tests. It may declare GPUs the machine does not have, which is how Ray's
placement is tried without them. Stopping it stops exactly this cluster (its own process group), never another
Ray cluster of the machine, which `ray stop` would."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import psutil

START_TIMEOUT_S = 90
STOP_GRACE_S = 10
PORT_OPTIONS = (
    "--port",
    "--dashboard-port",
    "--ray-client-server-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
    "--node-manager-port",
    "--object-manager-port",
)
"""Every port a head node listens on, each given a free one, so the cluster clashes with no other on the machine."""


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class RayHead(NamedTuple):
    address: str
    """The dashboard's address: what `RAY_ADDRESS` and `JobSubmissionClient` take."""
    session: int
    """The session id of every process of the cluster (the head's pid)."""


@contextlib.contextmanager
def local_ray_cluster(num_cpus: int, num_gpus: int) -> Iterator[RayHead]:
    """A head node declaring `num_cpus` CPUs and `num_gpus` GPUs, stopped with every process of it on leaving."""
    ports = dict(zip(PORT_OPTIONS, _free_ports(len(PORT_OPTIONS)), strict=True))
    # Ray's socket paths must stay short (108 bytes): a short directory under /tmp, not pytest's tmp_path.
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    log_path = Path(temp_dir) / "head.log"
    command = [
        str(Path(sys.executable).with_name("ray")),
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        f"--num-cpus={num_cpus}",
        f"--num-gpus={num_gpus}",
        f"--temp-dir={temp_dir}",
        "--dashboard-host=127.0.0.1",
        "--include-dashboard=true",
        *(f"{option}={port}" for option, port in ports.items()),
    ]
    with log_path.open("w") as log:
        head = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=os.environ | {"RAY_ADDRESS": ""}
        )
    address = f"http://127.0.0.1:{ports['--dashboard-port']}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if head.poll() is not None:
                raise RuntimeError(
                    f"the local Ray head exited with code {head.returncode}:\n{log_path.read_text()[-3000:]}"
                )
            with contextlib.suppress(OSError, ValueError):
                if cluster_resources(address).get("CPU"):  # the head node has registered its resources
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the local Ray head at {address} did not answer within {START_TIMEOUT_S} s:\n"
                    f"{log_path.read_text()[-3000:]}"
                )
            time.sleep(1)
        yield RayHead(address, head.pid)
    finally:
        _stop(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


def cluster_resources(address: str) -> dict[str, float]:
    """What a Ray cluster has in all (CPU, GPU, memory, ...), from its dashboard; empty until a node registered."""
    with urllib.request.urlopen(f"{address.rstrip('/')}/api/cluster_status", timeout=10) as response:
        usage = json.load(response)["data"]["clusterStatus"]["loadMetricsReport"]["usage"]
    return {name: total for name, (_used, total) in usage.items()}


def session_processes(session: int) -> list[psutil.Process]:
    """The live processes of a session (a zombie has ended; it waits for its reaper only)."""
    processes = []
    for process in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            if os.getsid(process.pid) == session and process.status() != psutil.STATUS_ZOMBIE:
                processes.append(process)
    return processes


def _stop(head: subprocess.Popen) -> None:
    """`ray start --block` stops the cluster when interrupted; its idle workers, which leave its process group but
    not its session, are killed after it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=STOP_GRACE_S)
    for process in session_processes(head.pid):
        with contextlib.suppress(psutil.Error):
            process.kill()
    head.wait()
