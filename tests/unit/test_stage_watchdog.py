"""The in-process launcher's time limit (`resources/launchers/inprocess.py`): a block past its limit is interrupted
in the main thread, however it blocks, with an exception of its own, and the processes it started are stopped; a
block within its limit is left alone; either way the signal's previous handler is back afterwards."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from resources.launchers.inprocess import TIME_LIMIT_SIGNAL, StageTimeLimitExceeded, _Watchdog
from tests.hangs import HUNG_WORKER


def test_a_block_past_its_limit_is_interrupted_where_it_waits_and_its_processes_are_stopped() -> None:
    previous = signal.getsignal(TIME_LIMIT_SIGNAL)
    watchdog = _Watchdog(1.0)
    with pytest.raises(StageTimeLimitExceeded, match="past its time limit of 1 s"), watchdog.watching():
        worker = subprocess.Popen([sys.executable, "-c", HUNG_WORKER])
        threading.Event().wait()  # a wait that never ends
    assert watchdog.expired
    assert worker.poll() is not None, "the worker the block started was stopped"
    assert signal.getsignal(TIME_LIMIT_SIGNAL) is previous


def test_a_block_within_its_limit_is_left_alone() -> None:
    previous = signal.getsignal(TIME_LIMIT_SIGNAL)
    watchdog = _Watchdog(60.0)
    with watchdog.watching():
        threading.Event().wait(0.5)
    assert not watchdog.expired
    assert signal.getsignal(TIME_LIMIT_SIGNAL) is previous
