"""The `subprocess` launcher: each stage a payload program of its own (`python -m noisy_student_assets.payloads`,
under torchrun when a training stage asks for several processes), in a process group of its own, reporting through
Dagster Pipes. A payload past its time limit is stopped with its whole group: torchrun's ranks, vLLM's workers."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import dagster as dg
import psutil

from resources.launchers.base import (
    TERMINATION_GRACE_S,
    Launcher,
    StageResult,
    payload_command,
    payload_outcome,
    signal_name,
    time_limit_failure,
    write_spec,
)

TORCHRUN_FAILURE = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<rank>\d+)")
STDERR_TAIL_LINES = 30
"""Lines of a failed payload's stderr its step failure quotes (torchrun's report of a dead rank ends there)."""


class SubprocessLauncher(Launcher):
    """One payload process after another, on this machine."""

    kind = "subprocess"

    def run_all(self, context: dg.AssetExecutionContext, specs: Sequence) -> list[StageResult]:
        return [self._run(context, spec) for spec in specs]

    def _run(self, context: dg.AssetExecutionContext, spec) -> StageResult:
        spec_path = write_spec(spec)
        pid_file = Path(spec.work_dir) / f"{spec.stage}-payload.pid"
        _stop_earlier_payload(pid_file, context.log)
        limit_s = spec.time_limit_s(self.settings)
        launched = time.perf_counter()
        with dg.open_pipes_session(
            context=context,
            context_injector=dg.PipesTempFileContextInjector(),
            message_reader=dg.PipesTempFileMessageReader(),
        ) as session:
            # A session of its own: the payload's children (vLLM engine workers, torchrun's ranks) are one process
            # group, stopped together whatever happens to the payload itself.
            process = subprocess.Popen(
                payload_command(spec_path, spec.processes),
                env=os.environ | session.get_bootstrap_env_vars(),
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            pid_file.write_text(f"{process.pid} {psutil.Process(process.pid).create_time()}")
            tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
            rank_failures: list[str] = []
            forward = threading.Thread(target=_forward_stderr, args=(process.stderr, tail, rank_failures), daemon=True)
            forward.start()
            try:
                returncode = process.wait(timeout=limit_s)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                _stop_group(process)
                pid_file.unlink(missing_ok=True)
                forward.join(timeout=TERMINATION_GRACE_S)
        if returncode is None:
            raise time_limit_failure(spec, limit_s)
        return payload_outcome(
            spec,
            session.get_custom_messages(),
            returncode,
            launched,
            causes=_dead_ranks(rank_failures),
            details={"stderr_tail": dg.MetadataValue.text("".join(tail))},
        )


def _stop_earlier_payload(pid_file: Path, log) -> None:
    """Stop the payload an earlier attempt of this stage left running in its work dir: a payload runs in a session of
    its own, so it outlives a Dagster process that was SIGKILLed. The retry resumes from the shards and TRL
    checkpoints that payload saved; two payloads must not write one work dir."""
    try:
        pid, created = pid_file.read_text().split()
        group = int(pid)
    except (FileNotFoundError, ValueError):
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        if psutil.Process(group).create_time() != float(created):
            # The pid names another process now, so the payload's group is gone (a group id is not reused while it
            # has members).
            return
    if not _group_members(group):
        return
    log.warning(
        f"stopping payload process group {group}, left running in {pid_file.parent} by an earlier attempt; this one "
        "resumes from its shards"
    )
    for stop, grace in ((signal.SIGTERM, TERMINATION_GRACE_S), (signal.SIGKILL, TERMINATION_GRACE_S)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, stop)
        deadline = time.monotonic() + grace
        while _group_members(group) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _group_members(group):
            return
    raise dg.Failure(
        f"the payload process group {group} left running in {pid_file.parent} by an earlier attempt did not stop"
    )


def _group_members(group: int) -> list[psutil.Process]:
    """The live (not zombie) processes of a process group."""
    members = []
    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(process.pid) == group and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process)
    return members


def _dead_ranks(stderr_lines) -> list[str]:
    """The ranks torchrun reports as failed ('failed (exitcode: -9) local_rank: 1 (pid: ...)'), in words."""
    dead = []
    for line in stderr_lines:
        found = TORCHRUN_FAILURE.search(line)
        if found:
            code = int(found["code"])
            how = f"was killed by {signal_name(code)}" if code < 0 else f"exited with code {code}"
            dead.append(f"rank {found['rank']} {how}")
    return dead


def _forward_stderr(stream, tail: deque[str], rank_failures: list[str]) -> None:
    """The payload's stderr into this process's (Dagster's compute log); its last lines, and torchrun's reports of
    failed ranks wherever they came, kept for the failure."""
    for line in stream:
        sys.stderr.write(line)
        tail.append(line)
        if TORCHRUN_FAILURE.search(line):
            rank_failures.append(line)


def _stop_group(process: subprocess.Popen) -> None:
    """Stop the payload's process group: politely while the payload still runs (an interrupted step, a stage past
    its time limit), then for good, so that no worker it started outlives it."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=TERMINATION_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
