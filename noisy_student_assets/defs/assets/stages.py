"""What every asset body shares: `stage` (the arm's overrides applied to the run config, an MLflow run, timers
and the metadata they fill), and `run_heavy`, the one step every heavy stage (sampling, the verifier's training and
scoring, a checkpoint's training, an evaluation) runs through: reuse of an identical published run, the device lock,
staging, timing, metadata, tracking, clean-up. Each stage supplies only its own part (a `HeavyStage`); training's and
evaluation's are here, a round's own in `rounds.py`. The stages themselves are core functions. The ML libraries and
mlflow are imported inside the functions so that loading the code location (UI, CLI, `definitions validate`) stays
fast."""

from __future__ import annotations

import json
import shutil
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import dagster as dg
import polars as pl

from noisy_student_assets.core import environment
from noisy_student_assets.core.checkpoints import weights_sha256
from noisy_student_assets.core.experiments.arms import Arm
from noisy_student_assets.core.problems import fingerprint as problems_fingerprint
from noisy_student_assets.core.profiles import active_profile
from noisy_student_assets.core.reporting.eval_report import (
    GREEDY_FILE,
    SAMPLED_FILE,
    PublishedEval,
    ReportExtras,
    deltas,
    metadata_key,
    write_eval_artifact,
)
from noisy_student_assets.core.settings import Settings, StudentSettings, resolved
from noisy_student_assets.core.training.base import GOLD, PSEUDO
from noisy_student_assets.core.training.compute import (
    CheckpointCompute,
    TrainingCompute,
    read_compute,
    record_compute,
    training_recipe,
)
from noisy_student_assets.core.training.modes.base import StudentData
from noisy_student_assets.defs.assets.metadata import markdown_table, png_markdown
from noisy_student_assets.defs.checks import eval_not_degenerate
from noisy_student_assets.defs.config import StageConfig, with_arm
from noisy_student_assets.defs.lineage import (
    DEFAULTS_KEY,
    STAGE_VERSION_KEY,
    fingerprint,
    input_data_versions,
    is_heavy,
    made_with,
    reuse_key,
    stage_defaults,
)
from noisy_student_assets.payloads.specs import EvalSpec, TrainSpec
from resources.compute import DEVICE_POOL
from resources.data_lake import CONTENT_KEY_FILE, DataLake
from resources.launchers.base import StageResult
from resources.stage_resources import StageResources

if TYPE_CHECKING:
    from noisy_student_assets.core.evaluation import EvalResult
    from noisy_student_assets.core.training.guards import OutputHealth

RETRY_DELAY_S = environment.retry_delay_s()
"""Seconds before a failed heavy step's retry (`environment.RETRY_DELAY_S`)."""
HEAVY = {"pool": DEVICE_POOL}
"""What every heavy asset (sampling, training, evaluation) is declared with: the `device` pool. `stage` retries a
heavy step once; the retry resumes from the stage's shards or TRL checkpoints."""
HEAVY_RETRIES = 1
DATASET_FILE, PROBLEMS_FILE, VALIDATION_FILE = "dataset.json", "problems.parquet", "validation.parquet"
"""What a payload reads from a stage's work dir: the training rows, the problems to sample or evaluate, the problems
a checked training run measures itself on."""


@dataclass
class StageRun:
    """One materialization in progress: its effective settings, its arm, its MLflow run and its metadata."""

    context: dg.AssetExecutionContext
    settings: Any
    """The run config with the arm's overrides applied, as the core's settings: what this materialization runs with."""
    arm: Arm | None
    resources: StageResources
    mlflow_run_id: str
    made_with: dict
    """What of its settings the data version covers (`lineage.made_with`)."""
    stage_version: str
    metadata: dict = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    """The `timed` blocks' seconds, logged to MLflow as the stage ends: after its results, since MLflow's Compare
    view opens on a run's first-logged metric (an eval's would be `eval_seconds`, not its accuracy)."""

    @property
    def partition(self) -> str | None:
        return self.arm.name if self.arm else None

    @property
    def lake(self) -> DataLake:
        return self.resources.lake

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Time the block as metadata and an MLflow metric `name` (e.g. "training_seconds"; see `timings`)."""
        started = time.perf_counter()
        yield
        seconds = time.perf_counter() - started
        self.metadata[name] = self.timings[name] = seconds

    def log_metrics(self, metrics: dict[str, float]) -> None:
        self.resources.tracking.log_metrics(metrics)

    def output(self, value: Any, name: str | None = None, metadata: dict | None = None) -> dg.Output:
        """The asset's output (`name`: a multi-asset's output) with this stage's metadata and its data version: the
        fingerprint of its stage version, settings and inputs' data versions (`lineage`)."""
        key = self.context.asset_key if name is None else self.context.assets_def.keys_by_output_name[name]
        inputs = input_data_versions(
            self.context.instance, self.context.job_def.asset_layer.asset_graph, key, self.partition
        )
        version = (
            dg.DataVersion(fingerprint(self.stage_version, self.made_with, inputs)) if inputs is not None else None
        )
        with warnings.catch_warnings():  # beta in Dagster: its warning would print on every asset's output
            warnings.simplefilter("ignore", dg.BetaWarning)
            return dg.Output(value, name or "result", metadata=self.metadata | (metadata or {}), data_version=version)


@contextmanager
def stage(
    context: dg.AssetExecutionContext,
    config: StageConfig | None,
    resources: StageResources,
    *,
    params: dict | None = None,
    name: str | None = None,
) -> Iterator[StageRun]:
    """Run an asset body as one stage: resolve the arm the partition names and apply its overrides to
    `config`, open the MLflow run (params: the effective settings and `params`), and on leaving add the
    settings, the arm and the MLflow run id to `StageRun.metadata`. `name` is needed by multi-assets only."""
    arm = resources.experiments.arm(context.partition_key) if context.has_partition_key else None
    settings, replaced = with_arm(config, arm) if config is not None else (None, [])
    for change in replaced:
        context.log.warning(f"arm {arm.name} overrides the run config: {change}")
    run_config = resolved(settings) if isinstance(settings, Settings) else {}
    version, defaults = stage_defaults(type(config) if config is not None else None)
    compute = resources.compute.settings.model_dump() if is_heavy(context.op_def) else None
    try:
        with resources.tracking.start_run(context, {"config": run_config} | (params or {}), arm, name=name) as run:
            current = StageRun(
                context,
                settings,
                arm,
                resources,
                run.info.run_id,
                made_with(run_config, compute, active_profile()),
                version,
            )
            yield current
            current.log_metrics(current.timings)
    except Exception as error:
        # Retried here, not by a Dagster RetryPolicy: Dagster retries an interrupted step that has one, so Ctrl-C
        # or SIGTERM would start an in-process stage over. An interrupt (not an Exception) stops the run.
        if (interrupt := interrupt_behind(error)) is not None:
            raise type(interrupt)() from error  # a new one: the first, raised again, would close a cycle via `error`
        if is_heavy(context.op_def) and _retryable(error):
            raise dg.RetryRequested(max_retries=HEAVY_RETRIES, seconds_to_wait=RETRY_DELAY_S) from error
        raise
    current.metadata |= {
        "config": dg.MetadataValue.json(run_config),
        STAGE_VERSION_KEY: version,
        DEFAULTS_KEY: dg.MetadataValue.json(defaults),
        "profile": active_profile(),
        "mlflow_run_id": run.info.run_id,
        "mlflow_run": dg.MetadataValue.url(resources.tracking.run_url(run.info.experiment_id, run.info.run_id)),
    }
    stage_name = config.arm_stage if config is not None else None
    if arm is not None and stage_name is not None:
        current.metadata |= {
            "arm": arm.name,
            "arm_stage": stage_name,
            "arm_overrides": dg.MetadataValue.json(arm.overrides(stage_name)),
            "arm_overrides_sha": arm.overrides_sha(stage_name),
        }


def not_asked_for(context: dg.AssetExecutionContext, resources: StageResources) -> str | None:
    """Why the experiment of the arm the partition names does not ask for this asset (a control it does not list), or
    None. A job launched from the UI (`round_00N_job`) selects every control of its round whichever arm is picked:
    such a control yields no output, and Dagster skips its evaluation and checks."""
    from noisy_student_assets.core.experiments.progress import asks_for

    arm = resources.experiments.arm(context.partition_key)
    name = context.asset_key.to_user_string()
    experiment = resources.experiments.experiment(arm)
    if asks_for(experiment, arm, name):
        return None
    return (
        f"skipped: experiment {arm.experiment} does not ask for {name} for arm {arm.name} "
        f"(its controls: {', '.join(experiment.controls)})"
    )


def interrupt_behind(error: BaseException) -> BaseException | None:
    """The interrupt (Ctrl-C, SIGTERM) `error` was raised while handling, if any. A library whose cleanup fails as
    an interrupt unwinds it (MLflow's SQLAlchemy session on a closed connection) raises an ordinary exception in its
    place, which must stop the run as the interrupt would, not earn a retry that starts the stage over."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, (KeyboardInterrupt, dg.DagsterExecutionInterruptedError)):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _retryable(error: Exception) -> bool:
    """Whether a heavy stage's error earns the retry: not a retry already, nor a failure that says it would fail
    again."""
    return not isinstance(error, dg.RetryRequested) and not (isinstance(error, dg.Failure) and not error.allow_retries)


Output = TypeVar("Output")


@dataclass(frozen=True)
class HeavyStage(ABC, Generic[Output]):
    """What a heavy stage supplies to `run_heavy`, the step every one of them runs through: what keys its reuse,
    what it stages for its payloads, and how its output is read, from its own run or from an identical published
    one. The rest (recall or launch, the device lock, timing, metadata, tracking, clean-up) is the step's."""

    current: StageRun
    reuse_key: str
    """Everything that shapes its output (`lineage.reuse_key`): an identical published run is read back by it, and
    its work dir (where an interrupted attempt left resumable state) is named after it."""
    seconds_name: ClassVar[str]
    """The metadata entry and MLflow metric its run's time goes under ("training_seconds")."""
    publishes_staged: ClassVar[bool]
    """Whether its staged directory is what its asset publishes (a checkpoint, a report: it carries the reuse key);
    otherwise the directory only holds the payloads' output files until `read` has read them."""
    identical: ClassVar[str]
    """What a published run shares with this one to be reused, for the log."""

    def __init_subclass__(cls, *, seconds_name: str, publishes_staged: bool, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.seconds_name, cls.publishes_staged = seconds_name, publishes_staged

    @abstractmethod
    def stage(self, work_dir: Path, staged: Path) -> list:
        """Write its payloads' inputs into `work_dir`; their specs (`payloads.specs`), which write into `staged`."""

    @abstractmethod
    def read(self, staged: Path, results: list[StageResult]) -> Output:
        """Its output, once its payloads have written `staged` and returned `results`."""

    @abstractmethod
    def recall(self, published: Path) -> Output:
        """Its output, read back from `published`, an identical run's artifact."""

    def payload_fields(self, work_dir: Path) -> dict:
        """What every payload's spec carries: the compute settings and its work dir."""
        return {"compute": self.current.resources.compute.settings, "work_dir": str(work_dir)}


@dataclass(frozen=True)
class Ran(Generic[Output]):
    """A heavy stage's output, and where it came from."""

    output: Output
    reused_from: Path | None
    """The identical published run read back (None: launched)."""
    results: list[StageResult] = field(default_factory=list)
    """What its payloads returned (none when reused)."""


def recalled(current: StageRun, reuse_key: str, identical: str) -> Path | None:
    """The identical published artifact `reuse_key` names (`DataLake.recall`), logged as reused (`identical` says what
    it shares with this run) and put into `current.metadata` as `reused_from`; None where there is none."""
    published = current.lake.recall(reuse_key)
    if published is not None:
        current.context.log.info(f"Reusing {published}: {identical}")
        current.metadata["reused_from"] = dg.MetadataValue.path(str(published))
    return published


def run_heavy(current: StageRun, heavy: HeavyStage[Output]) -> Ran[Output]:
    """Run a heavy stage: read back the identical published run its reuse key names, if there is one (its place goes
    into `current.metadata` as `reused_from`); otherwise stage its payloads' inputs, launch them under the device lock,
    timed, merge their metadata (a sharded stage's under `payload/parts`), log their trainers' steps through the
    tracking resource and read the output. Then the work dir goes, and the staged directory is keyed for reuse (an
    artifact) or removed (read into a table)."""
    context, lake, resources = current.context, current.lake, current.resources
    if (published := recalled(current, heavy.reuse_key, heavy.identical)) is not None:
        return Ran(heavy.recall(published), published)
    work_dir = lake.work_dir(context.asset_key, current.partition, heavy.reuse_key[:16])
    work_dir.mkdir(parents=True, exist_ok=True)
    staged = lake.staging_dir()
    specs = heavy.stage(work_dir, staged)
    with resources.launcher.device_held(resources.compute, context.log.info), current.timed(heavy.seconds_name):
        results = resources.launcher.run_all(context, specs)
    if len(results) == 1:
        current.metadata |= results[0].metadata
    else:
        current.metadata["payload/parts"] = dg.MetadataValue.json([result.metadata for result in results])
    for result in results:
        for step, logs in result.steps:  # TRL's step logs of a payload, which writes to no tracking store itself
            resources.tracking.log_metrics(logs, step=step)
    output = heavy.read(staged, results)
    if heavy.publishes_staged:
        (staged / CONTENT_KEY_FILE).write_text(heavy.reuse_key)
    else:
        shutil.rmtree(staged, ignore_errors=True)
    shutil.rmtree(work_dir, ignore_errors=True)  # resumable state is only for a crashed attempt
    return Ran(output, None, results)


@dataclass(frozen=True)
class Training(HeavyStage[Path], seconds_name="training_seconds", publishes_staged=True):
    """The training stage (`core.training.student`): a checkpoint trained from `init_dir` on `dataset`, which records
    its compute and its lineage's (`compute.json`); an identical run is reused by hard links."""

    init_dir: Path
    dataset: Any
    """The training rows (a `datasets.Dataset`), as fingerprinted."""
    settings: StudentSettings
    validation: pl.DataFrame | None = None
    """The problems a checked run measures itself on (`grpo.validation_every`), as fingerprinted."""

    @property
    def identical(self) -> str:
        return f"the same {self.settings.mode} run (init weights, training rows, settings) already published"

    def stage(self, work_dir: Path, staged: Path) -> list:
        (work_dir / DATASET_FILE).write_text(json.dumps(self.dataset.to_list()))
        if self.validation is not None:
            self.validation.write_parquet(work_dir / VALIDATION_FILE)
        settings = self.settings
        self.current.context.log.info(
            f"{settings.mode} from {self.init_dir} on {len(self.dataset)} rows for {settings.grpo.max_steps} steps"
        )
        return [
            TrainSpec(
                init_dir=str(self.init_dir),
                dataset=str(work_dir / DATASET_FILE),
                validation=str(work_dir / VALIDATION_FILE) if self.validation is not None else None,
                settings=settings,
                **self.payload_fields(work_dir),
                output_dir=str(staged),
            )
        ]

    def read(self, staged: Path, results: list[StageResult]) -> Path:
        (result,) = results
        return self._recorded(staged, TrainingCompute(**result.result["compute"]))

    def recall(self, published: Path) -> Path:
        return self._recorded(self.current.lake.stage_copy(published), read_compute(published).own)

    def _recorded(self, checkpoint: Path, own: TrainingCompute) -> Path:
        from noisy_student_assets.core.training.base import read_training_log
        from noisy_student_assets.core.training.grpo import stop_reason

        grpo = self.settings.grpo
        stopped = stop_reason(read_training_log(checkpoint) or [], grpo, own.optimizer_steps)
        record_compute(checkpoint, own, self.init_dir, training_recipe(grpo), stopped)
        return checkpoint


@dataclass(frozen=True)
class Completions:
    """An evaluation's greedy and sampled completions, and the staged directory its report goes into."""

    staged: Path
    greedy: pl.DataFrame
    sampled: pl.DataFrame

    @classmethod
    def read(cls, directory: Path, *, into: Path) -> Completions:
        """The completions written in `directory`, the report to go `into` a staged directory."""
        return cls(into, pl.read_parquet(directory / GREEDY_FILE), pl.read_parquet(directory / SAMPLED_FILE))


@dataclass(frozen=True)
class Evaluation(HeavyStage[Completions], seconds_name="eval_seconds", publishes_staged=True):
    """The evaluation stage's generation (`core.evaluation.eval_completions`): a checkpoint's completions of the eval
    problems. Those of bit-identical weights on the same problems with the same settings (another arm's labeled RL,
    say) are read back; the report around them is still the asset's own."""

    identical = "the same weights, eval problems and settings"
    checkpoint_dir: Path
    """The checkpoint evaluated (its weights' sha256 is in the reuse key)."""
    problems: pl.DataFrame

    def stage(self, work_dir: Path, staged: Path) -> list:
        self.problems.write_parquet(work_dir / PROBLEMS_FILE)
        return [
            EvalSpec(
                checkpoint_dir=str(self.checkpoint_dir),
                problems=str(work_dir / PROBLEMS_FILE),
                settings=self.current.settings,
                **self.payload_fields(work_dir),
                output_dir=str(staged),
            )
        ]

    def read(self, staged: Path, results: list[StageResult]) -> Completions:
        return Completions.read(staged, into=staged)

    def recall(self, published: Path) -> Completions:
        staged = self.current.lake.staging_dir()
        (staged / CONTENT_KEY_FILE).write_text(self.reuse_key)  # the report made here is as reusable as the one read
        return Completions.read(published, into=staged)


def train_checkpoint(current: StageRun, *, init_dir: Path, data: StudentData, settings: StudentSettings) -> Path:
    """Train from `init_dir` (the training stage, `core.training.student`) into a staged checkpoint directory,
    for the checkpoint IO manager to publish; metadata goes into `current.metadata`. Labeled RL and the
    labeled-only control train GRPO on the labeled problems alone (`train_on_labeled`).

    The checkpoint records its compute and its lineage's (`compute.json`), and the trainer's step log
    (`training_log.json`, whose answer rewards give the `reward_saturation` metadata). A run identical to one already
    published (same init weights, training rows and settings, by any arm) is reused by hard links instead
    of trained again; its metadata names where it came from. Steps with a non-finite loss or gradient norm
    are skipped and logged as warnings; too many in a row, or a trained checkpoint with non-finite weights,
    fail the asset before anything is published.
    """
    from noisy_student_assets.core.training.base import read_training_log
    from noisy_student_assets.core.training.grpo import logged_rewards, saturation_summary
    from noisy_student_assets.core.training.student import training_fingerprint, training_set
    from noisy_student_assets.core.training.validation_stop import best_check, logged_checks, require_validation

    try:  # before anything is staged, and not retried
        require_validation(settings.grpo.validation_every, data.validation)
    except ValueError as error:
        raise dg.Failure(str(error)) from error
    dataset = training_set(settings, data)
    init_sha = weights_sha256(init_dir)
    compute = current.resources.compute.settings
    run_fingerprint = reuse_key(training_fingerprint(settings, init_sha, dataset, compute, data.validation), settings)
    ran = run_heavy(current, Training(current, run_fingerprint, init_dir, dataset, settings, data.validation))
    staged = ran.output
    metrics = {name: float(value) for name, value in ran.results[0].result["metrics"].items()} if ran.results else {}
    sources = list(dataset["label_source"]) if "label_source" in dataset.column_names else [PSEUDO] * len(dataset)
    spent = read_compute(staged)
    compute_metrics = {f"compute/{k}": v for k, v in spent.own.as_dict().items()} | {
        f"compute/total_{k}": v for k, v in spent.total.as_dict().items()
    }
    current.log_metrics({f"final/{name}": value for name, value in metrics.items()} | compute_metrics)
    options = settings.changed()
    current.metadata |= (
        metrics
        | compute_metrics
        | {
            "training_mode": settings.mode,
            **({"student_options": dg.MetadataValue.json(options)} if options else {}),
            "init_checkpoint": dg.MetadataValue.path(str(init_dir)),
            "init_weights_sha256": init_sha,
            "weights_sha256": weights_sha256(staged),
            "training_fingerprint": run_fingerprint,
            "train_rows": len(dataset),
            "gold_rows": sources.count(GOLD),
            "pseudo_rows": sources.count(PSEUDO),
            "grpo_settings": dg.MetadataValue.json(settings.grpo.model_dump()),
        }
    )
    current.metadata["stopped"] = spent.stopped
    log = read_training_log(staged) or []
    if rewards := logged_rewards(log):
        current.metadata["reward_saturation"] = saturation_summary(rewards)
    if checks := logged_checks(log):
        current.metadata["validation_checks"] = dg.MetadataValue.json({str(c.step): c.accuracy for c in checks})
        current.metadata["kept_step"] = best_check(checks).step
    return staged


def capped_to_teacher(current: StageRun, generations: pl.DataFrame) -> None:
    """Cap the stage's GRPO completions by the round's teacher samples' lengths (`grpo.completion_cap`: `generations`,
    the round's) where its settings give a `completion_cap_margin`, so that the student and each control of a round
    train with the same cap; the cap and the length it came from go into the metadata."""
    from noisy_student_assets.core.training.grpo import COMPLETION_CAP_QUANTILE, completion_cap

    grpo = current.settings.grpo
    if grpo.completion_cap_margin is None:
        return
    cap, length = completion_cap(generations["n_tokens"], grpo)
    current.settings = current.settings.model_copy(
        update={"grpo": grpo.model_copy(update={"max_completion_length": cap})}
    )
    current.metadata |= {
        "completion_cap": cap,
        f"teacher_completion_tokens_p{round(100 * COMPLETION_CAP_QUANTILE)}": length,
    }
    current.context.log.info(
        f"completions capped at {cap} tokens: the teacher's samples' {COMPLETION_CAP_QUANTILE:.0%} length {length:g} "
        f"+ margin {grpo.completion_cap_margin}, at most max_completion_length {grpo.max_completion_length}"
    )


def train_on_labeled(
    current: StageRun, init_dir: Path, labeled_problems: pl.DataFrame, validation: pl.DataFrame | None = None
) -> Path:
    """GRPO (`current.settings.grpo`) from `init_dir` on the labeled problems alone, rewarded against their gold
    answers: labeled RL, which checks itself on the `validation` problems where `grpo.validation_every` says, and the
    labeled-only control that continues it."""
    grpo_only = StudentSettings(grpo=current.settings.grpo)
    data = StudentData(labeled_problems, validation=validation if grpo_only.grpo.validation_every else None)
    return train_checkpoint(current, init_dir=init_dir, data=data, settings=grpo_only)


def _eval_metrics(
    result: EvalResult,
    health: OutputHealth,
    recorded: CheckpointCompute,
    deltas_against: dict[str, PublishedEval | None] | None,
    extras: Callable[[dict[str, float], pl.DataFrame], ReportExtras] | None,
) -> tuple[dict[str, float], dict[str, float], ReportExtras]:
    """An evaluation's metrics (its scores', its outputs' health, the compute its checkpoint's lineage trained with,
    the differences against `deltas_against`, the `extras`'), the differences alone, and the extras, which say why the
    checkpoint's own training stopped where it recorded a reason."""
    spent = recorded.total  # what the checkpoint's lineage trained with, for comparisons
    metrics = (
        dict(result.metrics) | health.as_dict() | {f"compute/total_{k}": float(v) for k, v in spent.as_dict().items()}
    )
    delta_metrics = deltas(
        result.metrics, {name: found.metrics for name, found in (deltas_against or {}).items() if found}
    )
    metrics |= delta_metrics
    added = extras(metrics, result.scores) if extras else ReportExtras()
    if recorded.stopped:  # the checkpoint's own training: how many steps it took and why it ended there
        added = replace(added, text="\n\n".join(filter(None, (added.text, f"Training stopped: {recorded.stopped}."))))
    return metrics | added.metrics, delta_metrics, added


def evaluate(
    current: StageRun,
    *,
    checkpoint_dir: Path,
    eval_problems: pl.DataFrame,
    deltas_against: dict[str, PublishedEval | None] | None = None,
    extras: Callable[[dict[str, float], pl.DataFrame], ReportExtras] | None = None,
) -> tuple[Path, dict[str, float], dg.AssetCheckResult]:
    """Evaluate `checkpoint_dir` on `eval_problems` (the evaluation stage, `core.evaluation`, with
    `current.settings`: `EvalSettings`) into a staged report directory for the eval IO manager to publish, and
    fill `current.metadata`. Returns the staged directory, the metrics and the `eval_not_degenerate` check's result
    (answer, truncation and identical-completion rates of the greedy outputs against the settings' thresholds).

    `deltas_against` maps a name ("previous_round", "labeled_rl", "base_model") to that checkpoint's evaluation
    (None: not materialized); the report adds the differences for every shared metric. `extras`, given the
    metrics and the per-problem scores, returns further metrics, figures, tables and a leading text.
    """
    import mlflow

    from noisy_student_assets.core.evaluation import eval_content_key, scored
    from noisy_student_assets.core.training.guards import degenerate_output_failure, output_health

    context, settings = current.context, current.settings
    eval_key = reuse_key(eval_content_key(weights_sha256(checkpoint_dir), eval_problems, settings), settings)
    ran = run_heavy(current, Evaluation(current, eval_key, checkpoint_dir, eval_problems))
    resumed = sum(result.result["resumed_passes"] for result in ran.results)
    if resumed:  # shards of an attempt killed midway (same eval key) are kept; this attempt generated the rest
        context.log.info(f"Resumed {resumed} problem passes from the shards of an interrupted attempt")
        current.metadata["resumed_problem_passes"] = float(resumed)
    staged, greedy, sampled = ran.output.staged, ran.output.greedy, ran.output.sampled
    result = scored(eval_problems, greedy, sampled, settings)
    health = output_health(result.greedy)
    metrics, delta_metrics, added = _eval_metrics(result, health, read_compute(checkpoint_dir), deltas_against, extras)
    title = "/".join(context.asset_key.path) + (f" (arm {current.partition})" if current.partition else "")
    inline_report, _ = write_eval_artifact(
        staged,
        title=title,
        result=result,
        metrics=metrics,
        extras=added,
        checkpoint=checkpoint_dir,
        eval_problems_fingerprint=problems_fingerprint(eval_problems),
    )
    current.log_metrics(metrics)
    if current.arm is not None:
        current.resources.tracking.log_by_round(current.arm, list(context.asset_key.path), metrics["greedy_accuracy"])
    mlflow.log_artifacts(str(staged), artifact_path="eval_report")
    current.metadata |= {
        # Floats are what the UI plots; the deltas (a dozen more charts) go in one table instead.
        **{k: float(v) for k, v in metrics.items() if k not in delta_metrics},
        **({"deltas": dg.MetadataValue.json(delta_metrics)} if delta_metrics else {}),
        "report": dg.MetadataValue.md(inline_report),
        **{stem: png_markdown(stem, png) for stem, png in added.figures.items()},
        **{metadata_key(section): markdown_table(table, max_rows=None) for section, table in added.tables.items()},
        "checkpoint": dg.MetadataValue.path(str(checkpoint_dir)),
    }
    return (
        staged,
        metrics,
        eval_not_degenerate(
            context.asset_key,
            health,
            degenerate_output_failure(
                health,
                unevaluated_rate=metrics["unevaluated_rate"],
                min_answer_rate=settings.min_answer_rate,
                max_truncation_rate=settings.max_truncation_rate,
                max_identical_share=settings.max_identical_share,
                max_unevaluated_rate=settings.max_unevaluated_rate,
            ),
        ),
    )
