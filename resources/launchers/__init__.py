"""Where a heavy stage runs (`launcher` resource): `inprocess`, in the Dagster step's own process (the default:
nothing more to start); `subprocess`, as a payload program of its own (`python -m noisy_student_assets.payloads`,
under torchrun when a training stage asks for several processes) that reports through Dagster Pipes; or `ray`, the
same payload submitted as a Ray job (dagster-ray's Pipes reader brings its messages back), which Ray places on free
GPUs of its cluster and queues while there are none. Each kind is a `Launcher` class of its own (`base.py`), found
by its name in `registry.py`; the resource is their one config surface.

Either way the stage is the same function (`payloads.stages.run`) on the same spec; only the transport differs, and
every kind stops a stage past its time limit (`launcher.time_limit_*`). The asset body keeps what touches the lake
and the instance: reuse, publishing, checks, MLflow. Only this (orchestrating) process writes to the Dagster
instance and the MLflow store; a payload on another machine sends its logs and step metrics back through Pipes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import dagster as dg

from noisy_student_assets.core import environment
from noisy_student_assets.core.settings import LauncherSettings
from resources.compute import ComputeResource
from resources.derived import derived_class
from resources.launchers.base import Launcher, StageResult
from resources.launchers.registry import launcher_class


class StageLauncher(derived_class(LauncherSettings, "StageLauncherFields", dg.ConfigurableResource)):
    """How the heavy stages (sampling, training, evaluation) run (`core.settings.LauncherSettings`)."""

    @property
    def implementation(self) -> Launcher:
        """The launcher class `kind` names, on these settings."""
        return launcher_class(self.kind)(LauncherSettings(**self.model_dump()))

    def run(self, context: dg.AssetExecutionContext, spec) -> StageResult:
        """Run the stage `spec` describes; a failure raises `dg.Failure` naming the stage and the payload's cause."""
        (result,) = self.run_all(context, [spec])
        return result

    def run_all(self, context: dg.AssetExecutionContext, specs: Sequence) -> list[StageResult]:
        """Run the stages `specs` describe (a stage's shards): at once on Ray, one after another otherwise."""
        launcher = self.implementation
        for spec in specs:
            Path(spec.work_dir).mkdir(parents=True, exist_ok=True)
            refusal = launcher.refusal(spec)
            if refusal:
                raise dg.Failure(refusal, allow_retries=False)
        return launcher.run_all(context, specs)

    @contextlib.contextmanager
    def device_held(self, compute: ComputeResource, log: Callable[[str], None]) -> Iterator[None]:
        """This machine's device lock around a stage that runs on this machine; none around Ray jobs, whose devices
        Ray accounts for."""
        if not self.implementation.on_this_machine:
            yield
            return
        with compute.exclusive(log):
            yield


def code_location_launcher() -> StageLauncher:
    """The launcher of the code location's runs: `NOISY_STUDENT_LAUNCHER`'s kind, else the profile's."""
    kind = environment.launcher_kind()
    return StageLauncher(kind=kind) if kind else StageLauncher()
