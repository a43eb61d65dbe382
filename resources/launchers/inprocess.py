"""The `inprocess` launcher (the default): each stage in the Dagster step's own process, nothing more to start.

Its time limit is a watchdog thread, for a stage is ordinary Python in this process and cannot be killed alone.
Past the limit the watchdog sends the main thread, where Dagster runs a step (`dg.materialize`, the step process of
the multiprocess executor), a signal of the stage's own (SIGUSR1), whose handler raises `StageTimeLimitExceeded`
there. A signal also breaks a blocking wait (a lock, a socket, `Event.wait`), which an exception set from another
thread would not. The exception is a BaseException, so that no `except Exception` of the stage's libraries swallows
it, and not a KeyboardInterrupt, so that nothing takes it for Ctrl-C; the stage's own cleanup runs as it unwinds
(vLLM's engine shutdown), and once it ended, the processes it started and left (vLLM's engine core and workers) are
stopped. A stage still running a grace after the signal (blocked in C code that checks no signal, on a worker that
hangs) has the processes it started stopped, which frees such a wait, and is signalled again, until it ends. Only a
stage blocked where neither reaches (a hung CUDA kernel) keeps its step: the `subprocess` launcher, which kills the
payload's whole process group, is the one for that. Outside the main thread (no signal handler runs there) the
watchdog can only stop the stage's processes."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from multiprocessing import resource_tracker

import dagster as dg
import psutil

from noisy_student_assets.core.training.base import step_line
from noisy_student_assets.payloads import stages
from resources.launchers.base import (
    TERMINATION_GRACE_S,
    Launcher,
    StageResult,
    set_aside_metadata,
    time_limit_failure,
)

TIME_LIMIT_SIGNAL = signal.SIGUSR1
"""What interrupts a stage past its limit: not SIGALRM, which math-verify's alarms own, nor SIGINT or SIGTERM, which
Dagster turns into an interrupt that stops the run."""


class StageTimeLimitExceeded(BaseException):
    """Raised in the thread of a stage past its time limit."""


class _DagsterReporter:
    """A stage run in the Dagster process reports into the run log, and TRL logs into the active MLflow run."""

    report_to = ("mlflow",)

    def __init__(self, log) -> None:
        self.log = log
        self.set_aside_messages: list[str] = []

    def info(self, message: str) -> None:
        self.log.info(message)

    def warning(self, message: str) -> None:
        self.log.warning(message)

    def step(self, step: int, max_steps: int, logs: dict[str, float]) -> None:
        self.log.info(step_line(step, max_steps, logs))

    def set_aside(self, message: str) -> None:
        self.log.warning(message)
        self.set_aside_messages.append(message)


class InProcessLauncher(Launcher):
    """One stage after another, in this process."""

    kind = "inprocess"

    def refusal(self, spec) -> str | None:
        if spec.processes > 1:
            return (
                f"stage {spec.stage} asks for {spec.processes} processes: use the subprocess or ray launcher "
                "(launcher.kind)"
            )
        return None

    def run_all(self, context: dg.AssetExecutionContext, specs: Sequence) -> list[StageResult]:
        results = []
        for spec in specs:
            limit_s = spec.time_limit_s(self.settings)
            watchdog = _Watchdog(limit_s)
            try:
                reporter = _DagsterReporter(context.log)
                with watchdog.watching():
                    result = stages.run(spec, reporter)
                results.append(StageResult(result, metadata=set_aside_metadata(reporter.set_aside_messages)))
            except (StageTimeLimitExceeded, Exception) as error:  # an interrupt (Ctrl-C, SIGTERM) stays one
                if (
                    watchdog.expired
                ):  # or whatever the stage raised as it was stopped (an engine whose workers died, say)
                    raise time_limit_failure(spec, limit_s) from error
                raise
            if watchdog.expired:  # it ended in the instant it was stopped; its workers are gone
                raise time_limit_failure(spec, limit_s)
        return results


class _Watchdog:
    """Stops the block it watches (in the thread that enters it) once it ran `limit_s` seconds; see the module."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.expired = False
        self._inside = False
        """Whether the watched block still runs: the signal handler raises only then. A plain attribute, set without a
        call, so that no signal handler runs between the block's end and the flag saying so."""
        self._ended = threading.Event()
        self._thread = threading.current_thread()
        self._earlier_children: set[tuple[int, float]] = set()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        self._earlier_children = {_identity(child) for child in _children()}
        in_main = self._thread is threading.main_thread()
        previous = signal.signal(TIME_LIMIT_SIGNAL, self._on_signal) if in_main else None
        watcher = threading.Thread(target=self._watch, name="stage-time-limit", daemon=True)
        self._inside = True
        watcher.start()
        try:
            yield
        finally:
            self._inside = False
            self._ended.set()
            # A signal the watcher sent before it saw the end was delivered to this thread while it waited here, so
            # under the handler that ignores it now, not under the one restored below.
            watcher.join()
            if in_main:  # None: a handler not installed from Python, which it cannot restore
                signal.signal(TIME_LIMIT_SIGNAL, signal.SIG_DFL if previous is None else previous)
            if self.expired:
                self._stop_children()

    def _on_signal(self, signum, frame) -> None:
        if self._inside:
            raise StageTimeLimitExceeded(f"past its time limit of {self.limit_s:.0f} s")

    def _watch(self) -> None:
        if self._ended.wait(self.limit_s):
            return
        self.expired = True
        # Outside the main thread no signal handler runs: stopping the stage's processes is all there is to do.
        while self._thread is threading.main_thread() and not self._ended.is_set():
            signal.pthread_kill(self._thread.ident, TIME_LIMIT_SIGNAL)
            if self._ended.wait(TERMINATION_GRACE_S):
                return
            self._stop_children()
        if not self._ended.is_set():
            self._stop_children()

    def _stop_children(self) -> None:
        """Stop the processes the stage started: SIGTERM, then SIGKILL to those still there after the grace. Not
        multiprocessing's resource tracker, which the stage's first spawned process (vLLM's engine) may have started:
        it serves this whole process, and it is what cleans up the semaphores and shared memory of the workers
        stopped here. multiprocessing keeps its pid there; a Python that does not has it stopped with the rest
        (multiprocessing starts another when it is next needed)."""
        tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
        started = [
            child for child in _children() if _identity(child) not in self._earlier_children and child.pid != tracker
        ]
        for child in started:
            with contextlib.suppress(psutil.Error):
                child.terminate()
        _, alive = psutil.wait_procs(started, timeout=TERMINATION_GRACE_S)
        for child in alive:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(alive, timeout=TERMINATION_GRACE_S)


def _children() -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return psutil.Process().children(recursive=True)
    return []


def _identity(process: psutil.Process) -> tuple[int, float]:
    with contextlib.suppress(psutil.Error):
        return process.pid, process.create_time()
    return process.pid, 0.0
