"""math-verify equivalence checks in a persistent helper process, bounded by the CPU time they spend.

A check's bound must not depend on the machine's load: a helper that is merely descheduled has not
spent its budget.  So the helper bounds each check (both parses and the comparison) by its own CPU
time, with an interval timer on CPU time (``ITIMER_PROF``) whose handler raises, and math-verify's
own timeouts - ``signal.alarm``, wall-clock seconds - are disabled.  The caller keeps a wall-clock
bound only as a backstop, several times the CPU bound: no signal interrupts a single huge C-level
operation, and a stopped or starved helper uses no CPU at all.

* The helper is started with ``subprocess`` (fork + immediate exec of a fresh interpreter, so no
  threads of the caller - torch's, say - are duplicated) running this file as a script with
  ``python -P``: unlike multiprocessing's spawn, it does not re-import the caller's ``__main__``
  or this package's ``__init__``, only the standard library and math-verify.
* The helper stays in its caller's process group, so that a SIGKILL to the group (a killed grid) ends it with the
  rest, even mid-check; it ignores SIGINT, so that a Ctrl-C stays its caller's to handle (the caller stops it, or it
  exits on EOF once the caller is gone).
* Startup (interpreter, math-verify import, one warm-up check) is paid once per calling process
  (and after each kill), and is bounded separately by ``STARTUP_TIMEOUT_S``.
* A check that runs out of CPU time, outlives the backstop, or whose helper dies or fails to start
  is retried once on a fresh helper; if that attempt fails too, its verdict is None (ungraded),
  never a False that only says the machine was busy.
* Parses are LRU-cached in the helper, because consensus voting compares the same strings many
  times; a parse that ran out of time raises through the cache, so only finished parses are kept.

This file is run as a script, so it must import nothing from its package.
"""

import atexit
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from functools import lru_cache
from multiprocessing.connection import Connection

STARTUP_TIMEOUT_S = 60.0
"""Wall-clock bound on starting a helper, which is not counted against any one check's bound."""
BACKSTOP_FACTOR = 20.0
"""The caller's wall-clock backstop on one check, as a multiple of its CPU bound: it ends only checks
whose helper got less than this fraction of a core (stopped, or stuck in one C-level operation)."""
ATTEMPTS = 2
"""A check that does not finish is tried once more, on a fresh helper, before it is ungraded."""
_log = logging.getLogger(__name__)
_READY = "ready"


class MathVerifyWorker:
    """Thread-safe client of one helper process; concurrent callers are served one at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        atexit.register(self.close)
        os.register_at_fork(after_in_child=self._forget_after_fork)

    def equivalent(self, gold: str, answer: str, cpu_s: float) -> bool | None:
        """math-verify's ``verify(parse(gold), parse(answer))`` within ``cpu_s`` CPU seconds; None when
        neither attempt finished (see the module docstring)."""
        with self._lock:
            for _ in range(ATTEMPTS):
                verdict = self._attempt(gold, answer, cpu_s)
                if verdict is not None:
                    return verdict
                self._stop()  # a fresh helper for the next attempt and the next check
            return None

    def close(self) -> None:
        """Kill and reap the helper (runs at interpreter exit)."""
        with self._lock:
            self._stop()

    def _attempt(self, gold: str, answer: str, cpu_s: float) -> bool | None:
        try:
            if self._conn is None:
                self._start()
            self._conn.send((gold, answer, cpu_s))
            if self._conn.poll(cpu_s * BACKSTOP_FACTOR):
                verdict = self._conn.recv()
                if verdict is None:
                    _log.warning("math-verify check ran out of its %.1f CPU seconds", cpu_s)
                return verdict
            _log.warning("math-verify check outlived its %.0f s backstop; killing its worker", cpu_s * BACKSTOP_FACTOR)
        except Exception:  # noqa: BLE001 - died or never started; "never raise" outranks the cause
            _log.warning("math-verify worker failed", exc_info=True)
        return None

    def _start(self) -> None:
        parent_end, child_end = socket.socketpair()
        with parent_end, child_end:
            self._proc = subprocess.Popen(
                [sys.executable, "-P", os.path.abspath(__file__), str(child_end.fileno())],
                pass_fds=(child_end.fileno(),),
                stdin=subprocess.DEVNULL,
            )
            self._conn = Connection(parent_end.detach())
        if not self._conn.poll(STARTUP_TIMEOUT_S) or self._conn.recv() != _READY:
            raise TimeoutError("math-verify worker did not start")

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def _forget_after_fork(self) -> None:
        # A forked child must neither talk to nor kill its parent's helper; it starts its own.
        self._lock = threading.Lock()
        self._proc = None
        self._conn = None


class _OutOfCpuTime(BaseException):
    """Raised by the CPU timer; a BaseException, so that math-verify's ``except Exception`` (which
    turns errors into an empty parse or a False) cannot swallow it."""


def _out_of_cpu_time(signum, frame) -> None:
    raise _OutOfCpuTime


def _serve(fd: int) -> None:
    """Helper process: answer (gold, answer, cpu_s) requests with verify's result, or None when the
    check ran out of CPU time, until the caller leaves."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    logging.disable(logging.WARNING)  # math-verify warns that its own timeouts are off: ours bound it
    extraction_config = [LatexExtractionConfig(), ExprExtractionConfig()]
    signal.signal(signal.SIGPROF, _out_of_cpu_time)

    @lru_cache(maxsize=16384)
    def parse_answer(answer: str) -> list:
        # Bare LaTeX such as "\frac12" only parses inside math delimiters.
        return parse(f"${answer}$", extraction_config, parsing_timeout=None)

    def equivalent(gold: str, answer: str, cpu_s: float) -> bool | None:
        signal.setitimer(signal.ITIMER_PROF, cpu_s)
        try:
            return verify(parse_answer(gold), parse_answer(answer), timeout_seconds=None)
        except _OutOfCpuTime:
            return None
        except Exception:  # noqa: BLE001 - math-verify raises on some malformed input
            return False
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)

    equivalent("1", "1", STARTUP_TIMEOUT_S)  # warm up the LaTeX parser before declaring readiness
    conn = Connection(fd)
    conn.send(_READY)
    while True:
        try:
            gold, answer, cpu_s = conn.recv()
        except EOFError:
            return
        try:
            verdict = equivalent(gold, answer, cpu_s)
        except _OutOfCpuTime:  # the timer fired as the check returned, before it was disarmed
            verdict = None
        conn.send(verdict)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
