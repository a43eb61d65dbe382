"""The `ray` launcher: each stage's payload submitted as a Ray job (dagster-ray's Pipes reader brings its messages
back), which Ray places on free GPUs of its cluster and queues while there are none; a stage's shards run at once.
A job's time limit counts from when Ray started running it: queued, it is not yet at work."""

from __future__ import annotations

import contextlib
import re
import shlex
import signal
import time
from collections.abc import Sequence

import dagster as dg

from noisy_student_assets.core import environment
from resources.launchers.base import (
    Launcher,
    StageResult,
    payload_command,
    payload_outcome,
    time_limit_failure,
    write_spec,
)

RAY_EXIT_CODE = re.compile(r"failed with exit code (?P<code>-?\d+)")
RAY_WORK_DIR = "noisy_student_work_dir"
"""The Ray job metadata naming the work dir a job writes (a later attempt of the stage stops a job left running)."""
RAY_POLL_S = 1.0


class RayLauncher(Launcher):
    """Ray jobs on the cluster at `ray_address` (else RAY_ADDRESS), asking for `cpus_per_process` and
    `gpus_per_process` per process of a stage."""

    kind = "ray"
    on_this_machine = False

    def asks(self, spec) -> dict[str, float]:
        """What a payload asks of Ray: CPUs and GPUs for each of its processes."""
        return {
            "CPU": self.settings.cpus_per_process * spec.processes,
            "GPU": self.settings.gpus_per_process * spec.processes,
        }

    def run_all(self, context: dg.AssetExecutionContext, specs: Sequence) -> list[StageResult]:
        """Submit each spec's payload as a Ray job asking for its CPUs and GPUs, all at once, and wait for every one."""
        from dagster_ray.core.pipes import PipesRayJobMessageReader
        from ray.job_submission import JobSubmissionClient

        from resources.ray_cluster import cluster_resources

        stage = specs[0].stage
        address = self.settings.ray_address or environment.ray_address()
        if not address:
            raise dg.Failure(
                f"stage {stage} failed: the ray launcher has no cluster: set RAY_ADDRESS or launcher.ray_address "
                "(the grid starts a local cluster when neither is set)",
                allow_retries=False,
            )
        try:
            client = JobSubmissionClient(address)
            available = cluster_resources(address)
        except (ConnectionError, OSError, RuntimeError, ValueError) as error:
            raise dg.Failure(
                f"stage {stage} failed: the Ray cluster at {address} is not reachable ({type(error).__name__}: {error})"
            ) from error
        self._check_asks(specs, available, address)
        _stop_earlier_jobs(client, {spec.work_dir for spec in specs}, context.log)
        launched = time.perf_counter()
        jobs = []
        with contextlib.ExitStack() as sessions:
            for spec in specs:
                session = sessions.enter_context(
                    dg.open_pipes_session(
                        context=context,
                        context_injector=dg.PipesEnvContextInjector(),
                        message_reader=PipesRayJobMessageReader(),
                    )
                )
                asks = self.asks(spec)
                job_id = client.submit_job(
                    entrypoint=shlex.join(payload_command(write_spec(spec), spec.processes)),
                    entrypoint_num_cpus=asks["CPU"],
                    entrypoint_num_gpus=asks["GPU"],
                    runtime_env={"env_vars": environment.forwarded() | session.get_bootstrap_env_vars()},
                    metadata={RAY_WORK_DIR: spec.work_dir},
                )
                session.report_launched({"extras": {"ray_job_id": job_id, "ray_address": address}})
                context.log.info(f"stage {spec.stage}: Ray job {job_id} submitted to {address}, asking for {asks}")
                jobs.append((spec, session, job_id))
            limits = {job_id: spec.time_limit_s(self.settings) for spec, _, job_id in jobs}
            try:
                overdue = _wait_for_jobs(client, list(limits), limits)
            except BaseException:  # the step was interrupted: its jobs stop with it
                _stop_jobs(client, limits)
                raise
            if overdue:  # the step fails: every job of it stops (the retry resumes from their shards)
                _stop_jobs(client, limits)
                _wait_for_jobs(client, list(limits))
                spec = next(spec for spec, _, job_id in jobs if job_id == overdue[0])
                raise time_limit_failure(spec, limits[overdue[0]])
        return [_job_result(client, spec, session, job_id, launched, address) for spec, session, job_id in jobs]

    def _check_asks(self, specs: Sequence, available: dict[str, float], address: str) -> None:
        """Fail, not retried, where a spec asks for more of a resource than the whole cluster has."""
        for spec in specs:
            for resource, amount in self.asks(spec).items():
                if amount > available.get(resource, 0.0):
                    raise dg.Failure(
                        f"stage {spec.stage} failed: it asks Ray for {amount:g} {resource} and the cluster at "
                        f"{address} has {available.get(resource, 0.0):g} in all, so Ray would queue it forever "
                        "(launcher.gpus_per_process, launcher.cpus_per_process, grpo.processes)",
                        allow_retries=False,
                    )


def _job_result(client, spec, session, job_id: str, launched: float, address: str) -> StageResult:
    """A finished Ray job's payload outcome: its exit code from Ray's message (else 1), the job's message kept."""
    info = client.get_job_info(job_id)
    found = RAY_EXIT_CODE.search(info.message or "")
    returncode = 0 if info.status.value == "SUCCEEDED" else _shell_returncode(int(found["code"])) if found else 1
    causes = [] if found or returncode == 0 else [f"the Ray job {job_id} ended {info.status.value}: {info.message}"]
    return payload_outcome(
        spec,
        session.get_custom_messages(),
        returncode,
        launched,
        causes=causes,
        details={"ray_job_message": dg.MetadataValue.text((info.message or "")[-4000:])},
        metadata={"ray/job_id": job_id, "ray/address": address},
    )


def _shell_returncode(code: int) -> int:
    """Ray runs the entrypoint through a shell, which reports a child killed by signal N as 128 + N."""
    return -(code - 128) if code > 128 and (code - 128) in signal.Signals._value2member_map_ else code


def _stop_jobs(client, job_ids) -> None:
    for job_id in job_ids:
        with contextlib.suppress(Exception):
            client.stop_job(job_id)


def _wait_for_jobs(client, job_ids: list[str], limits: dict[str, float] | None = None) -> list[str]:
    """Wait until every job ended, or one ran (status RUNNING) past its time limit in `limits`: those returned."""
    from ray.job_submission import JobStatus

    pending, running_since = set(job_ids), {}
    while pending:
        statuses = {job_id: client.get_job_status(job_id) for job_id in pending}
        pending = {job_id for job_id, status in statuses.items() if not status.is_terminal()}
        now = time.monotonic()
        for job_id in pending:
            if statuses[job_id] == JobStatus.RUNNING:
                running_since.setdefault(job_id, now)
        overdue = [
            job_id
            for job_id, since in running_since.items()
            if job_id in pending and limits and now - since > limits[job_id]
        ]
        if overdue:
            return overdue
        if pending:
            time.sleep(RAY_POLL_S)
    return []


def _stop_earlier_jobs(client, work_dirs: set[str], log) -> None:
    """Stop the Ray jobs still running in these work dirs: a killed grid's, whose step is being retried. The retry
    resumes from the shards and TRL checkpoints those jobs saved; two jobs must not write one work dir."""
    earlier = [
        job
        for job in client.list_jobs()
        if (job.metadata or {}).get(RAY_WORK_DIR) in work_dirs and not job.status.is_terminal()
    ]
    for job in earlier:
        log.warning(
            f"stopping Ray job {job.submission_id}, left running in {job.metadata[RAY_WORK_DIR]} by an earlier "
            "attempt; this one resumes from its shards"
        )
        client.stop_job(job.submission_id)
    _wait_for_jobs(client, [job.submission_id for job in earlier])
