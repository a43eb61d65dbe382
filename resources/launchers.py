"""Where a heavy stage runs (`launcher` resource): `inprocess`, in the Dagster step's own process (the default:
nothing more to start); `subprocess`, as a payload program of its own (`python -m noisy_student_assets.payloads`,
under torchrun when a training stage asks for several processes) that reports through Dagster Pipes; or `ray`, the
same payload submitted as a Ray job (dagster-ray's Pipes reader brings its messages back), which Ray places on free
GPUs of its cluster and queues while there are none.

Either way the stage is the same function (`payloads.stages.run`) on the same spec; only the transport differs.
The asset body keeps what touches the lake and the instance: reuse, publishing, checks, MLflow. Only this
(orchestrating) process writes to the Dagster instance and the MLflow store; a payload on another machine sends its
logs and step metrics back through Pipes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import psutil

from noisy_student_assets.core.settings import LauncherSettings
from noisy_student_assets.payloads import stages
from noisy_student_assets.payloads.specs import StageSpec
from noisy_student_assets.payloads.stages import ERROR, RESULT, STEP, TIMING, step_line
from resources.compute import ComputeResource
from resources.derived import derived_class

LAUNCHER_ENV_VAR = "NOISY_STUDENT_LAUNCHER"
"""The code location's launcher kind (the runs the UI, the CLI and the daemon launch), where a deployment sets it;
unset: the profile's. The grid's `--launcher` and an experiment's `launcher:` still win for the grid's runs."""
PAYLOAD_MODULE = "noisy_student_assets.payloads"
TERMINATION_GRACE_S = 20
RAY_EXIT_CODE = re.compile(r"failed with exit code (?P<code>-?\d+)")
RAY_WORK_DIR = "noisy_student_work_dir"
"""The Ray job metadata naming the work dir a job writes (a later attempt of the stage stops a job left running)."""
FORWARDED_ENV = ("NOISY_STUDENT_", "HF_", "TRANSFORMERS_", "VLLM_", "PYTHONPATH")
"""The orchestrator's environment variables a Ray job is given (a Ray worker does not inherit the submitter's)."""
RAY_POLL_S = 1.0
TORCHRUN_FAILURE = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<rank>\d+)")
STDERR_TAIL_LINES = 30
"""Lines of a failed payload's stderr its step failure quotes (torchrun's report of a dead rank ends there)."""


@dataclass(frozen=True)
class StageResult:
    result: dict
    """What the stage returned (`payloads.stages`)."""
    steps: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    """TRL's logs of each step, for the orchestrator to write to MLflow, when the payload could not (out of process)."""
    metadata: dict = field(default_factory=dict)
    """How long a payload took to start, what the launch cost beyond its stage, and where it ran (`payload/*`,
    `ray/*`; none in process)."""


class _DagsterReporter:
    """A stage run in the Dagster process reports into the run log, and TRL logs into the active MLflow run."""

    report_to = ("mlflow",)

    def __init__(self, log) -> None:
        self.log = log

    def info(self, message: str) -> None:
        self.log.info(message)

    def warning(self, message: str) -> None:
        self.log.warning(message)

    def step(self, step: int, max_steps: int, logs: dict[str, float]) -> None:
        self.log.info(step_line(step, max_steps, logs))


class StageLauncher(derived_class(LauncherSettings, "StageLauncherFields", dg.ConfigurableResource)):
    """How the heavy stages (sampling, training, evaluation) run (`core.settings.LauncherSettings`)."""

    def run(self, context: dg.AssetExecutionContext, spec) -> StageResult:
        """Run the stage `spec` describes; a failure raises `dg.Failure` naming the stage and the payload's cause."""
        (result,) = self.run_all(context, [spec])
        return result

    def run_all(self, context: dg.AssetExecutionContext, specs: Sequence) -> list[StageResult]:
        """Run the stages `specs` describe (a stage's shards): at once on Ray, one after another otherwise."""
        for spec in specs:
            Path(spec.work_dir).mkdir(parents=True, exist_ok=True)
            if self.kind == "inprocess" and spec.processes > 1:
                raise dg.Failure(
                    f"stage {spec.stage} asks for {spec.processes} processes: use the subprocess or ray launcher (launcher.kind)", allow_retries=False
                )
        if self.kind == "inprocess":
            return [StageResult(stages.run(spec, _DagsterReporter(context.log))) for spec in specs]
        if self.kind == "subprocess":
            return [_run_payload(context, spec) for spec in specs]
        return _run_on_ray(context, specs, self)

    @contextlib.contextmanager
    def device_held(self, compute: ComputeResource, log: Callable[[str], None]) -> Iterator[None]:
        """This machine's device lock around a stage that runs on this machine; none around Ray jobs, whose devices
        Ray accounts for."""
        if self.kind == "ray":
            yield
            return
        with compute.exclusive(log):
            yield

    def ray_asks(self, spec) -> dict[str, float]:
        """What a payload asks of Ray: CPUs and GPUs for each of its processes."""
        return {"CPU": self.cpus_per_process * spec.processes, "GPU": self.gpus_per_process * spec.processes}


def code_location_launcher() -> StageLauncher:
    """The launcher of the code location's runs: `NOISY_STUDENT_LAUNCHER`'s kind, else the profile's."""
    kind = os.environ.get(LAUNCHER_ENV_VAR, "").strip()
    return StageLauncher(kind=kind) if kind else StageLauncher()


def payload_command(spec_path: Path, processes: int) -> list[str]:
    """The payload's command line: under torchrun (gloo on CPU, NCCL on GPU) when it trains on several processes."""
    payload = ["-m", PAYLOAD_MODULE, str(spec_path)]
    if processes == 1:
        return [sys.executable, *payload]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *payload]


def _write_spec(spec) -> Path:
    spec_path = Path(spec.work_dir) / f"{spec.stage}-spec.json"
    spec_path.write_text(StageSpec(spec=spec).model_dump_json())
    return spec_path


def _run_payload(context: dg.AssetExecutionContext, spec) -> StageResult:
    spec_path = _write_spec(spec)
    pid_file = Path(spec.work_dir) / f"{spec.stage}-payload.pid"
    _stop_earlier_payload(pid_file, context.log)
    launched = time.perf_counter()
    with dg.open_pipes_session(
        context=context, context_injector=dg.PipesTempFileContextInjector(), message_reader=dg.PipesTempFileMessageReader()
    ) as session:
        # A session of its own: the payload's children (vLLM engine workers, torchrun's ranks) are one process group,
        # stopped together whatever happens to the payload itself.
        process = subprocess.Popen(
            payload_command(spec_path, spec.processes),
            env=os.environ | session.get_bootstrap_env_vars(),
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        pid_file.write_text(f"{process.pid} {psutil.Process(process.pid).create_time()}")
        tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        rank_failures: list[str] = []
        forward = threading.Thread(target=_forward_stderr, args=(process.stderr, tail, rank_failures), daemon=True)
        forward.start()
        try:
            returncode = process.wait()
        finally:
            _stop_group(process)
            pid_file.unlink(missing_ok=True)
            forward.join(timeout=TERMINATION_GRACE_S)
    return _outcome(
        spec, session.get_custom_messages(), returncode, launched,
        causes=_dead_ranks(rank_failures), details={"stderr_tail": dg.MetadataValue.text("".join(tail))},
    )  # fmt: skip


def _outcome(spec, messages: list, returncode: int, launched: float, *, causes: list[str], details: dict, metadata: dict | None = None) -> StageResult:
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
            "payload/started_at": timing["started_at"],
            "payload/finished_at": timing["finished_at"],
        }
        steps = [(message[STEP], message["logs"]) for message in messages if STEP in message]
        return StageResult(results[0], steps=steps, metadata=launch | (metadata or {}))
    errors = [message[ERROR] for message in messages if ERROR in message]
    if returncode < 0:
        ended = f"the payload was killed by {_signal_name(returncode)}"
    else:
        ended = f"the payload exited with code {returncode}" + (" without a result" if returncode == 0 else "")
    # A rank that died is the cause; what rank 0 raised then (a broken gloo pair, say) is its consequence.
    cause = "; ".join([*causes, *errors] or [ended])
    command = " ".join(payload_command(Path(spec.work_dir) / f"{spec.stage}-spec.json", spec.processes))
    raise dg.Failure(description=f"stage {spec.stage} failed: {cause}", metadata=details | {"command": command} | (metadata or {}))


def _run_on_ray(context: dg.AssetExecutionContext, specs: Sequence, launcher: StageLauncher) -> list[StageResult]:
    """Submit each spec's payload as a Ray job asking for its CPUs and GPUs, all at once, and wait for every one."""
    from dagster_ray.core.pipes import PipesRayJobMessageReader
    from ray.job_submission import JobSubmissionClient

    from resources.ray_cluster import cluster_resources

    stage = specs[0].stage
    address = launcher.ray_address or os.environ.get("RAY_ADDRESS", "")
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
        raise dg.Failure(f"stage {stage} failed: the Ray cluster at {address} is not reachable ({type(error).__name__}: {error})") from error
    for spec in specs:
        for resource, amount in launcher.ray_asks(spec).items():
            if amount > available.get(resource, 0.0):
                raise dg.Failure(
                    f"stage {spec.stage} failed: it asks Ray for {amount:g} {resource} and the cluster at {address} has "
                    f"{available.get(resource, 0.0):g} in all, so Ray would queue it forever (launcher.gpus_per_process, "
                    "launcher.cpus_per_process, grpo.processes)",
                    allow_retries=False,
                )
    _stop_earlier_jobs(client, {spec.work_dir for spec in specs}, context.log)
    launched = time.perf_counter()
    jobs = []
    with contextlib.ExitStack() as sessions:
        for spec in specs:
            session = sessions.enter_context(
                dg.open_pipes_session(context=context, context_injector=dg.PipesEnvContextInjector(), message_reader=PipesRayJobMessageReader())
            )
            asks = launcher.ray_asks(spec)
            job_id = client.submit_job(
                entrypoint=shlex.join(payload_command(_write_spec(spec), spec.processes)),
                entrypoint_num_cpus=asks["CPU"],
                entrypoint_num_gpus=asks["GPU"],
                runtime_env={"env_vars": _forwarded_env() | session.get_bootstrap_env_vars()},
                metadata={RAY_WORK_DIR: spec.work_dir},
            )
            session.report_launched({"extras": {"ray_job_id": job_id, "ray_address": address}})
            context.log.info(f"stage {spec.stage}: Ray job {job_id} submitted to {address}, asking for {asks}")
            jobs.append((spec, session, job_id))
        try:
            _wait_for_jobs(client, [job_id for _, _, job_id in jobs])
        except BaseException:  # the step was interrupted: its jobs stop with it
            for _, _, job_id in jobs:
                with contextlib.suppress(Exception):
                    client.stop_job(job_id)
            raise
    results = []
    for spec, session, job_id in jobs:
        info = client.get_job_info(job_id)
        found = RAY_EXIT_CODE.search(info.message or "")
        returncode = 0 if info.status.value == "SUCCEEDED" else _shell_returncode(int(found["code"])) if found else 1
        causes = [] if found or returncode == 0 else [f"the Ray job {job_id} ended {info.status.value}: {info.message}"]
        results.append(
            _outcome(
                spec, session.get_custom_messages(), returncode, launched, causes=causes,
                details={"ray_job_message": dg.MetadataValue.text((info.message or "")[-4000:])},
                metadata={"ray/job_id": job_id, "ray/address": address},
            )
        )  # fmt: skip
    return results


def _shell_returncode(code: int) -> int:
    """Ray runs the entrypoint through a shell, which reports a child killed by signal N as 128 + N."""
    return -(code - 128) if code > 128 and (code - 128) in signal.Signals._value2member_map_ else code


def _forwarded_env() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name.startswith(FORWARDED_ENV)}


def _wait_for_jobs(client, job_ids: list[str]) -> None:
    pending = set(job_ids)
    while pending:
        pending = {job_id for job_id in pending if not client.get_job_status(job_id).is_terminal()}
        if pending:
            time.sleep(RAY_POLL_S)


def _stop_earlier_jobs(client, work_dirs: set[str], log) -> None:
    """Stop the Ray jobs still running in these work dirs: a killed grid's, whose step is being retried. The retry
    resumes from the shards and TRL checkpoints those jobs saved; two jobs must not write one work dir."""
    earlier = [job for job in client.list_jobs() if (job.metadata or {}).get(RAY_WORK_DIR) in work_dirs and not job.status.is_terminal()]
    for job in earlier:
        log.warning(f"stopping Ray job {job.submission_id}, left running in {job.metadata[RAY_WORK_DIR]} by an earlier attempt; this one resumes from its shards")
        client.stop_job(job.submission_id)
    _wait_for_jobs(client, [job.submission_id for job in earlier])


def _stop_earlier_payload(pid_file: Path, log) -> None:
    """Stop the payload an earlier attempt of this stage left running in its work dir: a payload runs in a session of
    its own, so it outlives a Dagster process that was SIGKILLed. The retry resumes from the shards and TRL
    checkpoints that payload saved; two payloads must not write one work dir."""
    try:
        pid, created = pid_file.read_text().split()
        group = int(pid)
    except (FileNotFoundError, ValueError):
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        if psutil.Process(group).create_time() != float(created):
            return  # the pid names another process now, so the payload's group is gone (a group id is not reused while it has members)
    if not _group_members(group):
        return
    log.warning(f"stopping payload process group {group}, left running in {pid_file.parent} by an earlier attempt; this one resumes from its shards")
    for stop, grace in ((signal.SIGTERM, TERMINATION_GRACE_S), (signal.SIGKILL, TERMINATION_GRACE_S)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, stop)
        deadline = time.monotonic() + grace
        while _group_members(group) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _group_members(group):
            return
    raise dg.Failure(f"the payload process group {group} left running in {pid_file.parent} by an earlier attempt did not stop")


def _group_members(group: int) -> list[psutil.Process]:
    """The live (not zombie) processes of a process group."""
    members = []
    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(process.pid) == group and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process)
    return members


def _signal_name(returncode: int) -> str:
    return signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else f"signal {-returncode}"


def _dead_ranks(stderr_lines) -> list[str]:
    """The ranks torchrun reports as failed ('failed (exitcode: -9) local_rank: 1 (pid: ...)'), in words."""
    dead = []
    for line in stderr_lines:
        found = TORCHRUN_FAILURE.search(line)
        if found:
            code = int(found["code"])
            how = f"was killed by {_signal_name(code)}" if code < 0 else f"exited with code {code}"
            dead.append(f"rank {found['rank']} {how}")
    return dead


def _forward_stderr(stream, tail: deque[str], rank_failures: list[str]) -> None:
    """The payload's stderr into this process's (Dagster's compute log); its last lines, and torchrun's reports of
    failed ranks wherever they came, kept for the failure."""
    for line in stream:
        sys.stderr.write(line)
        tail.append(line)
        if TORCHRUN_FAILURE.search(line):
            rank_failures.append(line)


def _stop_group(process: subprocess.Popen) -> None:
    """Stop the payload's process group: politely while the payload still runs (an interrupted step), then for
    good, so that no worker it started outlives it."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=TERMINATION_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
