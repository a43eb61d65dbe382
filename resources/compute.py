"""The compute every heavy asset runs on: its settings are the core's `ComputeSettings`. Heavy assets also share
the op pool `gpu` (limit 1 in dagster.yaml), so two GPU steps never overlap, across runs too."""

import fcntl
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
from pydantic import Field

from noisy_student_assets.core.settings import ComputeSettings
from resources.derived import derived_class

DEVICE_POOL = "device"
"""The Dagster pool of the heavy steps (sampling, training, evaluation): one at a time across all runs, on this
machine's device, a GPU or the CPU (dagster.yaml sets its limit); the grid raises the limit on Ray, which places them
itself."""
DEVICE_LOCK_WAITING = "waiting for the device lock"
DEVICE_LOCK_ACQUIRED = "acquired the device lock"
DEVICE_LOCK_RELEASED = "released the device lock"


class ComputeResource(derived_class(ComputeSettings, "ComputeResourceFields", dg.ConfigurableResource)):
    """Device, precision and memory share for generation and training (`core.settings.ComputeSettings`), and this
    machine's device lock."""

    lock_dir: str = Field(default=tempfile.gettempdir(), description="where this machine's device lock file lives")

    @property
    def settings(self) -> ComputeSettings:
        return ComputeSettings(**self.model_dump(exclude={"lock_dir"}))

    @contextmanager
    def exclusive(self, log: Callable[[str], None]) -> Iterator[None]:
        """Hold this machine's lock on the device for the block.

        The `device` pool keeps Dagster from starting two heavy steps at once, but the SQLite instance's
        claim of a pool slot is not atomic: two runs that claimed in the same instant both got it
        (tests/e2e/test_rounds_cli.py). This lock closes the gap on one machine; the kernel releases
        it when its process dies, so a killed run never leaves it held.
        """
        path = Path(self.lock_dir) / f"noisy-student-{self.device}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log(f"{DEVICE_LOCK_WAITING} {path}: another heavy step holds it")
                fcntl.flock(handle, fcntl.LOCK_EX)
            log(f"{DEVICE_LOCK_ACQUIRED} {path}")
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                log(f"{DEVICE_LOCK_RELEASED} {path}")

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.settings.apply_threads()
