"""What every launcher shares: the interface a launcher kind implements (`Launcher`), a stage's result, its time
limit's failure, and what launching a payload program means (its command line, its spec file, its outcome), which
the `subprocess` and `ray` launchers share."""

from __future__ import annotations

import signal
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import dagster as dg

from noisy_student_assets.core.settings import LauncherSettings
from noisy_student_assets.payloads.specs import StageSpec
from noisy_student_assets.payloads.stages import ERROR, RESULT, SET_ASIDE, STEP, TIMING

PAYLOAD_MODULE = "noisy_student_assets.payloads"
TERMINATION_GRACE_S = 20
"""Seconds a stopped stage's processes get to end on SIGTERM before SIGKILL."""


@dataclass(frozen=True)
class StageResult:
    result: dict
    """What the stage returned (`payloads.stages`)."""
    steps: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    """TRL's logs of each step, for the orchestrator to write to MLflow, when the payload could not (out of process)."""
    metadata: dict = field(default_factory=dict)
    """How long a payload took to start, what the launch cost beyond its stage, and where it ran (`payload/*`,
    `ray/*`; none in process); what it set aside of a killed attempt (`set_aside_metadata`)."""


def set_aside_metadata(messages: list[str]) -> dict:
    """The `set_aside` metadata of a stage that moved aside partial files of a killed attempt (`core.resumable`): a
    sentence each; nothing where it moved none."""
    return {SET_ASIDE: dg.MetadataValue.json(messages)} if messages else {}


class Launcher(ABC):
    """One way of running the heavy stages (a `launcher.kind`), registered in `registry.py`. Every stage it runs
    ends within its time limit (`spec.time_limit_s`): past it, the stage and every process it started are stopped
    and `run_all` raises `time_limit_failure`, which `stage()` retries like any failure."""

    kind: ClassVar[str]
    on_this_machine: ClassVar[bool] = True
    """Whether its stages run on this machine, under this machine's device lock (a Ray job's devices are Ray's)."""

    def __init__(self, settings: LauncherSettings) -> None:
        self.settings = settings

    def refusal(self, spec) -> str | None:
        """Why this launcher cannot run `spec` at all (a failure no retry mends); None if it can."""
        return None

    @abstractmethod
    def run_all(self, context: dg.AssetExecutionContext, specs: Sequence) -> list[StageResult]:
        """Run the stages `specs` describe (a stage's shards); a failure raises `dg.Failure` naming the stage and its
        cause."""


def time_limit_failure(spec, limit_s: float) -> dg.Failure:
    steps, samples = spec.work()
    return dg.Failure(
        f"stage {spec.stage} failed: it ran past its time limit of {limit_s:.0f} s (launcher.time_limit_base_s + "
        f"{steps} steps x time_limit_per_step_s + {samples} samples x time_limit_per_sample_s) and was stopped"
    )


def payload_command(spec_path: Path, processes: int) -> list[str]:
    """The payload's command line: under torchrun (gloo on CPU, NCCL on GPU) when it trains on several processes."""
    payload = ["-m", PAYLOAD_MODULE, str(spec_path)]
    if processes == 1:
        return [sys.executable, *payload]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *payload]


def write_spec(spec) -> Path:
    spec_path = Path(spec.work_dir) / f"{spec.stage}-spec.json"
    spec_path.write_text(StageSpec(spec=spec).model_dump_json())
    return spec_path


def payload_outcome(
    spec,
    messages: list,
    returncode: int,
    launched: float,
    *,
    causes: list[str],
    details: dict,
    metadata: dict | None = None,
) -> StageResult:
    """The stage's result from its payload's messages, or a `dg.Failure` naming the stage and the cause: a rank that
    died, else the payload's own error, else how it ended."""
    results = [message[RESULT] for message in messages if RESULT in message]
    if returncode == 0 and results:
        timing = results[0].pop(TIMING)
        launch = {
            "payload/startup_seconds": timing["startup_seconds"],
            "payload/overhead_seconds": time.perf_counter() - launched - timing["stage_seconds"],
            "payload/host": timing["host"],
            "payload/cuda_visible_devices": timing["cuda_visible_devices"] or "",
            "payload/device": timing["device"],
            "payload/started_at": timing["started_at"],
            "payload/finished_at": timing["finished_at"],
        }
        steps = [(message[STEP], message["logs"]) for message in messages if STEP in message]
        set_aside = set_aside_metadata([message[SET_ASIDE] for message in messages if SET_ASIDE in message])
        return StageResult(results[0], steps=steps, metadata=launch | set_aside | (metadata or {}))
    errors = [message[ERROR] for message in messages if ERROR in message]
    if returncode < 0:
        ended = f"the payload was killed by {signal_name(returncode)}"
    else:
        ended = f"the payload exited with code {returncode}" + (" without a result" if returncode == 0 else "")
    # A rank that died is the cause; what rank 0 raised then (a broken gloo pair, say) is its consequence.
    cause = "; ".join([*causes, *errors] or [ended])
    command = " ".join(payload_command(Path(spec.work_dir) / f"{spec.stage}-spec.json", spec.processes))
    raise dg.Failure(
        description=f"stage {spec.stage} failed: {cause}", metadata=details | {"command": command} | (metadata or {})
    )


def signal_name(returncode: int) -> str:
    return (
        signal.Signals(-returncode).name
        if -returncode in signal.Signals._value2member_map_
        else f"signal {-returncode}"
    )
