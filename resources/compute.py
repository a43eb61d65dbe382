"""The compute every heavy asset runs on: its settings are the core's `ComputeSettings`. Heavy assets also share
the op pool `device` (limit 1 in dagster.yaml; the grid sets `device_slots`), so no more heavy steps than that share
the device, across runs too."""

import fcntl
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
from pydantic import Field

from noisy_student_assets.core.settings import ComputeSettings
from resources.derived import derived_class

DEVICE_POOL = "device"
"""The Dagster pool of the heavy steps (sampling, training, evaluation): one at a time across all runs, on this
machine's device, a GPU or the CPU (dagster.yaml sets its limit); the grid sets it to the compute's `device_slots`,
and raises it on Ray, which places them itself."""
DEVICE_LOCK_WAITING = "waiting for the device lock"
DEVICE_LOCK_ACQUIRED = "acquired the device lock"
DEVICE_LOCK_RELEASED = "released the device lock"
LOCK_POLL_S = 1.0
"""Seconds between tries of a device's locks while every slot is held."""


class ComputeResource(derived_class(ComputeSettings, "ComputeResourceFields", dg.ConfigurableResource)):
    """Device, precision and memory share for generation and training (`core.settings.ComputeSettings`), and this
    machine's device lock."""

    lock_dir: str = Field(default=tempfile.gettempdir(), description="where this machine's device lock file lives")

    @property
    def settings(self) -> ComputeSettings:
        return ComputeSettings(**self.model_dump(exclude={"lock_dir"}))

    @contextmanager
    def exclusive(self, log: Callable[[str], None]) -> Iterator[None]:
        """Hold one of this machine's `device_slots` locks on the device for the block.

        The `device` pool keeps Dagster from starting more heavy steps at once, but the SQLite instance's
        claim of a pool slot is not atomic: two runs that claimed in the same instant both got it
        (tests/e2e/test_rounds_cli.py). These locks close the gap on one machine; the kernel releases
        one when its process dies, so a killed run never leaves it held.
        """
        paths = [self.lock_path(slot) for slot in range(self.device_slots)]
        paths[0].parent.mkdir(parents=True, exist_ok=True)
        handles = [path.open("a") for path in paths]
        try:
            held = _first_free(handles)
            if held is None:
                log(f"{DEVICE_LOCK_WAITING} {', '.join(map(str, paths))}: other heavy steps hold every slot")
                while (held := _first_free(handles)) is None:
                    time.sleep(LOCK_POLL_S)
            log(f"{DEVICE_LOCK_ACQUIRED} {paths[held]}")
            try:
                yield
            finally:
                fcntl.flock(handles[held], fcntl.LOCK_UN)
                log(f"{DEVICE_LOCK_RELEASED} {paths[held]}")
        finally:
            for handle in handles:
                handle.close()

    def lock_path(self, slot: int) -> Path:
        """The lock file of one of the device's slots (the first keeps the name a one-slot device's lock has)."""
        return Path(self.lock_dir) / (f"noisy-student-{self.device}" + (f"-{slot}" if slot else "") + ".lock")

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.settings.apply_threads()


def _first_free(handles: list) -> int | None:
    """The index of the first lock file of `handles` this process could lock (it then holds it), or None."""
    for index, handle in enumerate(handles):
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return index
        except BlockingIOError:
            continue
    return None
