"""math-verify equivalence checks in a persistent helper process, under a hard wall-clock bound.

math-verify bounds its own work with ``signal.alarm``, which only works in the main thread, and
no signal can interrupt a single huge C-level operation such as a big-int power.  So every check
runs in a helper process that the caller can always SIGKILL:

* The helper is started with ``subprocess`` (fork + immediate exec of a fresh interpreter, so no
  threads of the caller - torch's, say - are duplicated) running this file as a script with
  ``python -P``: unlike multiprocessing's spawn, it does not re-import the caller's ``__main__``
  or this package's ``__init__``, only the standard library and math-verify.
* Startup (interpreter, math-verify import, one warm-up check) takes about 0.4 s, is paid once
  per calling process (and after each kill), and is bounded separately by ``STARTUP_TIMEOUT_S``.
* Each check waits at most its own timeout for the reply; past it the helper is killed and reaped,
  the check counts as "not equivalent", and the next check starts a fresh helper.
* Inside the helper math-verify's own alarms (``_INNER_TIMEOUT_S`` per parse and per comparison)
  end most slow cases without a kill, and parses are LRU-cached because consensus voting compares
  the same strings many times.

This file is run as a script, so it must import nothing from its package.
"""

import atexit
import logging
import os
import socket
import subprocess
import sys
import threading
from functools import lru_cache
from multiprocessing.connection import Connection

STARTUP_TIMEOUT_S = 60.0
"""Bound on starting a helper, which is not counted against any one check's timeout."""
_INNER_TIMEOUT_S = 1  # math-verify's alarms take whole seconds
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

    def equivalent(self, gold: str, answer: str, timeout_s: float) -> bool:
        """math-verify's ``verify(parse(gold), parse(answer))``; False on timeout or any failure."""
        with self._lock:
            try:
                if self._conn is None:
                    self._start()
                self._conn.send((gold, answer))
                if self._conn.poll(timeout_s):
                    return self._conn.recv() is True
                _log.warning("math-verify check exceeded %.1f s; killing its worker", timeout_s)
            except Exception:  # noqa: BLE001 - died or never started; "never raise" outranks the cause
                _log.warning("math-verify worker failed; a fresh one serves the next check", exc_info=True)
            self._stop()
            return False

    def close(self) -> None:
        """Kill and reap the helper (runs at interpreter exit)."""
        with self._lock:
            self._stop()

    def _start(self) -> None:
        parent_end, child_end = socket.socketpair()
        with parent_end, child_end:
            self._proc = subprocess.Popen(
                [sys.executable, "-P", os.path.abspath(__file__), str(child_end.fileno())],
                pass_fds=(child_end.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # the caller's Ctrl-C is the caller's; we exit on EOF
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


def _serve(fd: int) -> None:
    """Helper process: answer (gold, answer) requests with verify's result until the caller leaves."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    logging.disable(logging.WARNING)  # math-verify logs every timeout; the caller sees False
    extraction_config = [LatexExtractionConfig(), ExprExtractionConfig()]

    @lru_cache(maxsize=16384)
    def parse_answer(answer: str) -> list:
        # Bare LaTeX such as "\frac12" only parses inside math delimiters.
        return parse(f"${answer}$", extraction_config, parsing_timeout=_INNER_TIMEOUT_S)

    def equivalent(gold: str, answer: str) -> bool:
        try:
            return verify(parse_answer(gold), parse_answer(answer), timeout_seconds=_INNER_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - math-verify raises on some malformed input
            return False

    equivalent("1", "1")  # warm up the LaTeX parser before declaring readiness
    conn = Connection(fd)
    conn.send(_READY)
    while True:
        try:
            gold, answer = conn.recv()
        except EOFError:
            return
        conn.send(equivalent(gold, answer))


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
