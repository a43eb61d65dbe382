"""`python -m noisy_student_assets.payloads <spec.json>`: one heavy stage, reporting through Dagster Pipes.

Under torchrun (a training stage's `grpo.processes` > 1) every rank trains; rank 0 alone talks to Pipes, and
writes the checkpoint (`training.base.fit`). Any failure ends the process with a non-zero code: a Pipes step
whose payload never opened its context would otherwise pass for a success (dagster issue 17868). The error is
also sent as a message, so the step's failure names the payload's own cause.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import ClassVar

import psutil

from noisy_student_assets.core import environment
from noisy_student_assets.core.training.base import step_line
from noisy_student_assets.payloads.specs import StageSpec
from noisy_student_assets.payloads.stages import ERROR, RESULT, SET_ASIDE, STEP, TIMING, run


class PipesReporter:
    report_to: ClassVar[list[str]] = ["none"]

    def __init__(self, pipes) -> None:
        self.pipes = pipes

    def info(self, message: str) -> None:
        self.pipes.log.info(message)

    def warning(self, message: str) -> None:
        self.pipes.log.warning(message)

    def step(self, step: int, max_steps: int, logs: dict[str, float]) -> None:
        self.pipes.log.info(step_line(step, max_steps, logs))
        self.pipes.report_custom_message({STEP: step, "logs": logs})

    def set_aside(self, message: str) -> None:
        self.pipes.log.warning(message)
        self.pipes.report_custom_message({SET_ASIDE: message})


class RankReporter:
    """What a rank other than 0 says: to its own stderr, which torchrun prefixes with the rank."""

    report_to: ClassVar[list[str]] = ["none"]

    def info(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    warning = set_aside = info

    def step(self, step: int, max_steps: int, logs: dict[str, float]) -> None:
        return None


def _device_name(compute) -> str:
    """The device a stage ran on: `cpu`, or `cuda` with the card's name."""
    device = compute.resolved_device()
    if device != "cuda":
        return device
    import torch

    return f"cuda ({torch.cuda.get_device_name()})"


def main(argv: list[str]) -> int:
    begun = time.time()
    started = psutil.Process().create_time()  # the interpreter's start: what launching the payload cost before main
    spec = StageSpec.model_validate_json(Path(argv[0]).read_text()).spec
    rank, world = environment.torchrun_rank()
    if world != spec.processes:
        print(f"stage {spec.stage}: launched on {world} processes, its spec asks for {spec.processes}", file=sys.stderr)
        return 2
    spec.compute.apply_threads(world)
    if rank > 0:
        run(spec, RankReporter())
        return 0
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        try:
            result = run(spec, PipesReporter(pipes))
        except BaseException as error:
            pipes.report_custom_message({ERROR: f"{type(error).__name__}: {error}"})
            with contextlib.suppress(Exception):
                pipes.log.error(traceback.format_exc())
            raise
        finished = time.time()
        timing = {
            "startup_seconds": begun - started,
            "stage_seconds": finished - begun,
            "started_at": begun,
            "finished_at": finished,
            # Where it ran: the devices Ray (or the user) gave the payload, and the one its stage used.
            "host": socket.gethostname(),
            "cuda_visible_devices": environment.visible_devices(),
            "device": _device_name(spec.compute),
        }
        pipes.report_custom_message({RESULT: result | {TIMING: timing}})
    return 0


if __name__ == "__main__":  # vLLM spawns worker processes that re-import the main module
    sys.exit(main(sys.argv[1:]))
