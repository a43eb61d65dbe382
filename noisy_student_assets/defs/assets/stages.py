"""What every asset body shares: `stage` (the arm's overrides applied to the run config, an MLflow run,
timers and the metadata they fill), and the two heavy stages, GRPO training and evaluation. The ML
libraries and mlflow are imported inside the functions so that loading the code location (UI, CLI,
`definitions validate`) stays fast."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
import polars as pl

from noisy_student_assets.core.checkpoints import weights_sha256
from noisy_student_assets.core.experiments.arms import Arm
from noisy_student_assets.core.layout import METRICS_FILE, SCORES_FILE
from noisy_student_assets.core.problems import fingerprint
from noisy_student_assets.core.reporting import markdown
from noisy_student_assets.core.reporting.markdown import markdown_table as markdown_text
from noisy_student_assets.core.training.compute import read_compute, record_compute
from noisy_student_assets.core.training.student import StudentSettings
from noisy_student_assets.defs.assets.metadata import markdown_table, png_markdown
from noisy_student_assets.defs.checks import eval_not_degenerate
from noisy_student_assets.defs.config import resolved_config, with_arm
from resources.data_lake import CONTENT_KEY_FILE, DataLake
from resources.stage_resources import StageResources

if TYPE_CHECKING:
    from noisy_student_assets.core.evaluation import EvalResult

REPORT_NAME = "report"
"""An eval's report: `report.md` (figures beside it) and `report.html` (figures inlined, for MLflow's artifact
viewer, which shows markdown as raw text)."""
DELTA_PREFIX = "delta_vs_"
"""Metrics of an eval against another checkpoint's: `delta_vs_labeled_rl/greedy_accuracy`."""
GREEDY_FILE, SAMPLED_FILE = "greedy.parquet", "sampled.parquet"
"""In an eval's artifact: the completions it generated, which an identical eval elsewhere reuses."""


@dataclass
class StageRun:
    """One materialization in progress: its effective config, its arm, its MLflow run and its metadata."""

    context: dg.AssetExecutionContext
    config: Any
    """The run config with the arm's overrides applied: what this materialization runs with."""
    arm: Arm | None
    resources: StageResources
    mlflow_run_id: str
    metadata: dict = field(default_factory=dict)

    @property
    def partition(self) -> str | None:
        return self.arm.name if self.arm else None

    @property
    def lake(self) -> DataLake:
        return self.resources.lake

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Time the block as metadata and an MLflow metric `name` (e.g. "training_seconds")."""
        started = time.perf_counter()
        yield
        seconds = time.perf_counter() - started
        self.metadata[name] = seconds
        self.log_metrics({name: seconds})

    def log_metrics(self, metrics: dict[str, float]) -> None:
        self.resources.tracking.log_metrics(metrics)


@contextmanager
def stage(
    context: dg.AssetExecutionContext,
    config: Any,
    resources: StageResources,
    *,
    params: dict | None = None,
    name: str | None = None,
) -> Iterator[StageRun]:
    """Run an asset body as one stage: resolve the arm the partition names and apply its overrides to
    `config`, open the MLflow run (params: the effective config and `params`), and on leaving add the
    config, the arm and the MLflow run id to `StageRun.metadata`. `name` is needed by multi-assets only."""
    arm = resources.experiments.arm(context.partition_key) if context.has_partition_key else None
    effective, replaced = with_arm(config, arm) if config is not None else (None, [])
    for change in replaced:
        context.log.warning(f"arm {arm.name} overrides the run config: {change}")
    run_config = resolved_config(effective) if effective is not None else {}
    with resources.tracking.start_run(context, {"config": run_config} | (params or {}), arm, name=name) as run:
        current = StageRun(context, effective, arm, resources, run.info.run_id)
        yield current
    current.metadata |= {
        "config": dg.MetadataValue.json(run_config),
        "mlflow_run_id": run.info.run_id,
        "mlflow_run": dg.MetadataValue.url(resources.tracking.run_url(run.info.experiment_id, run.info.run_id)),
    }
    stage_name = getattr(type(config), "arm_stage", None)
    if arm is not None and stage_name is not None:
        current.metadata |= {
            "arm": arm.name,
            "arm_stage": stage_name,
            "arm_overrides": dg.MetadataValue.json(arm.overrides(stage_name)),
            "arm_overrides_sha": arm.overrides_sha(stage_name),
        }


def _dagster_log_callback(context: dg.AssetExecutionContext):
    """A TrainerCallback that writes TRL's step logs (loss, reward, ...) into the Dagster run log."""
    from transformers import TrainerCallback

    class DagsterLogCallback(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            shown = {k: round(v, 4) for k, v in (logs or {}).items() if isinstance(v, float)}
            context.log.info(f"step {state.global_step}/{state.max_steps}: {shown}")

    return DagsterLogCallback()


def train_checkpoint(
    current: StageRun,
    *,
    init_dir: Path,
    labeled: pl.DataFrame,
    pseudo_labeled: pl.DataFrame | None,
    generations: pl.DataFrame | None = None,
    student: StudentSettings | None = None,
) -> Path:
    """Train from `init_dir` into a staged checkpoint directory, for the checkpoint IO manager to publish;
    metadata goes into `current.metadata`. Without `student` (labeled RL, the labeled-only control): GRPO
    (`current.config.grpo`) on the labeled problems. With it, the student's mode, reward and noise on the
    labeled + kept `pseudo_labeled` problems (sft and dpo: on the latter's agreeing `generations` alone).

    The checkpoint records its compute and its lineage's (`compute.json`). A run identical to one already
    published (same init weights, training rows and settings, by any arm) is reused by hard links instead
    of trained again; its metadata names where it came from. Steps with a non-finite loss or gradient norm
    are skipped and logged as warnings; too many in a row, or a trained checkpoint with non-finite weights,
    fail the asset before anything is published.
    """
    from noisy_student_assets.core.training.grpo import GOLD, PSEUDO
    from noisy_student_assets.core.training.student import student_compute, train_student, training_set

    context, lake, compute = current.context, current.lake, current.resources.compute
    settings = current.config.grpo.to_settings()
    student = student or StudentSettings()
    dataset = training_set(student, settings.seed, labeled, pseudo_labeled, generations, settings.num_generations)
    init_sha = weights_sha256(init_dir)
    # Everything that shapes the run: TRL checkpoints of a crashed attempt live in a work dir under this
    # key (a retry resumes the same run, a changed input never resumes a stale one), and an identical
    # published run is found by it. Student settings at their defaults are left out, so that a GRPO run
    # keeps the key it had before they existed.
    options = student.changed()
    run_fingerprint = hashlib.sha256(
        json.dumps(
            [student.mode, init_sha, dataset.to_list(), settings.as_dict(), *([options] if options else [])], sort_keys=True, default=str
        ).encode()
    ).hexdigest()
    reusable = lake.recall(run_fingerprint)
    if reusable is not None:
        context.log.info(f"Reusing {reusable}: the same {student.mode} run (init weights, training rows, settings) already published")
        staged = lake.stage_copy(reusable)
        record_compute(staged, read_compute(reusable).own, init_dir)
        result_metadata = {"reused_from": dg.MetadataValue.path(str(reusable))}
    else:
        work_dir = lake.work_dir(context.asset_key, current.partition, run_fingerprint[:16])
        staged = lake.staging_dir()
        context.log.info(f"{student.mode} from {init_dir} on {len(dataset)} rows for {settings.max_steps} steps")
        with compute.exclusive(context.log.info), current.timed("training_seconds"):
            result = train_student(
                student,
                init_dir,
                dataset,
                settings,
                staged,
                work_dir=work_dir,
                device=compute.resolved_device,
                report_to=["mlflow"],
                callbacks=[_dagster_log_callback(context)],
                warn=context.log.warning,
            )
        record_compute(staged, student_compute(student, result, settings), init_dir)
        (staged / CONTENT_KEY_FILE).write_text(run_fingerprint)
        current.log_metrics({f"final/{k}": v for k, v in result.metrics.items()})
        shutil.rmtree(work_dir, ignore_errors=True)  # resumable state is only for a crashed attempt
        result_metadata = {k: float(v) for k, v in result.metrics.items()}
    sources = list(dataset["label_source"]) if "label_source" in dataset.column_names else [PSEUDO] * len(dataset)
    spent = read_compute(staged)
    current.log_metrics({f"compute/{k}": v for k, v in spent.own.as_dict().items()})
    current.log_metrics({f"compute/total_{k}": v for k, v in spent.total.as_dict().items()})
    current.metadata |= result_metadata | {
        "training_mode": student.mode,
        **({"student_options": dg.MetadataValue.json(options)} if options else {}),
        "init_checkpoint": dg.MetadataValue.path(str(init_dir)),
        "init_weights_sha256": init_sha,
        "weights_sha256": weights_sha256(staged),
        "training_fingerprint": run_fingerprint,
        "train_rows": len(dataset),
        "gold_rows": sources.count(GOLD),
        "pseudo_rows": sources.count(PSEUDO),
        "grpo_settings": dg.MetadataValue.json(settings.as_dict()),
        **{f"compute/{k}": v for k, v in spent.own.as_dict().items()},
        **{f"compute/total_{k}": v for k, v in spent.total.as_dict().items()},
    }
    return staged


@dataclass(frozen=True)
class ReportExtras:
    """What an eval asset adds to its report once its checkpoint's metrics and scores are known."""

    metrics: dict[str, float] = field(default_factory=dict)
    figures: dict[str, bytes] = field(default_factory=dict)
    """File stem -> PNG: stored in the report dir, inlined in the metadata, logged to MLflow."""
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    """Section title -> table: in report.md and as its own metadata entry."""
    text: str = ""
    """Markdown that leads the report (a verdict)."""


def evaluate(
    current: StageRun,
    *,
    checkpoint_dir: Path,
    eval_problems: pl.DataFrame,
    deltas_against: dict[str, dict] | None = None,
    extras: Callable[[dict[str, float], pl.DataFrame], ReportExtras] | None = None,
) -> tuple[dict[str, float], dg.AssetCheckResult]:
    """Evaluate `checkpoint_dir` on `eval_problems` (`current.config`: an `EvalConfig`); publish the report
    directory (per-problem scores, breakdown, metrics.json, report.md, figures) as this asset's artifact and
    fill `current.metadata`. Returns the metrics and the `eval_not_degenerate` check's result (answer,
    truncation and identical-completion rates of the greedy outputs against the config's thresholds).

    `deltas_against` maps a name ("previous_round", "labeled_rl", "base_model") to that checkpoint's
    metrics; the report adds the differences for every shared metric. `extras`, given the metrics and the
    per-problem scores, returns further metrics, figures, tables and a leading text for the report.
    """
    import mlflow

    from noisy_student_assets.core.evaluation import evaluate_checkpoint
    from noisy_student_assets.core.training.guards import output_health

    context, config, lake, compute = current.context, current.config, current.lake, current.resources.compute
    settings = config.to_settings()
    # An eval of bit-identical weights on the same problems with the same settings (another arm's labeled RL,
    # say) is read back instead of generated again; the report around it is still this asset's own.
    eval_key = hashlib.sha256(
        json.dumps(
            ["eval", weights_sha256(checkpoint_dir), fingerprint(eval_problems), asdict(settings), config.backend, config.batch_size],
            sort_keys=True,
        ).encode()
    ).hexdigest()
    published = lake.recall(eval_key)
    if published is not None:
        context.log.info(f"Reusing the completions of {published}: same weights, eval problems and settings")
        result = _read_eval_result(published, eval_problems, settings)
        current.metadata["reused_from"] = dg.MetadataValue.path(str(published))
    else:
        with compute.exclusive(context.log.info), current.timed("eval_seconds"):
            result = evaluate_checkpoint(
                checkpoint_dir,
                eval_problems,
                settings,
                backend=config.backend,
                device=compute.resolved_device,
                dtype=compute.dtype,
                batch_size=config.batch_size,
                progress=lambda done, total: context.log.info(f"eval: {done}/{total} problem passes (greedy, then sampled)"),
            )
    health = output_health(result.greedy)
    spent = read_compute(checkpoint_dir).total  # what the checkpoint's lineage trained with, for comparisons
    metrics = dict(result.metrics) | health.as_dict() | {f"compute/total_{k}": float(v) for k, v in spent.as_dict().items()}
    deltas = {
        f"{DELTA_PREFIX}{name}/{k}": v - other[k]
        for name, other in (deltas_against or {}).items()
        for k, v in result.metrics.items()
        if k in other and k != "problems"
    }
    metrics |= deltas
    added = extras(metrics, result.scores) if extras else ReportExtras()
    metrics |= added.metrics
    tables = {"By subject / level": result.breakdown} | added.tables
    title = "/".join(context.asset_key.path) + (f" (arm {current.partition})" if current.partition else "")
    report = _report_markdown(title, added.text, metrics, tables)
    staged = lake.staging_dir()
    result.scores.write_parquet(staged / SCORES_FILE)
    result.breakdown.write_parquet(staged / "breakdown.parquet")
    result.greedy.write_parquet(staged / GREEDY_FILE)
    result.sampled.write_parquet(staged / SAMPLED_FILE)
    (staged / CONTENT_KEY_FILE).write_text(eval_key)
    for title, table in tables.items():
        table.write_parquet(staged / f"{_metadata_key(title)}.parquet")
    (staged / METRICS_FILE).write_text(
        json.dumps({"metrics": metrics, "checkpoint": str(checkpoint_dir), "eval_problems": fingerprint(eval_problems)}, indent=2)
    )
    inline_report = markdown.write_report(staged, REPORT_NAME, title, report, added.figures)
    current.log_metrics(metrics)
    mlflow.log_artifacts(str(staged), artifact_path="eval_report")
    final = lake.publish(staged, context.asset_key, current.partition)
    current.metadata |= {
        # Floats are what the UI plots; the deltas (a dozen more charts) go in one table instead.
        **{k: float(v) for k, v in metrics.items() if k not in deltas},
        **({"deltas": dg.MetadataValue.json(deltas)} if deltas else {}),
        "report": dg.MetadataValue.md(inline_report),
        **{stem: png_markdown(stem, png) for stem, png in added.figures.items()},
        **{_metadata_key(title): markdown_table(table, max_rows=None) for title, table in added.tables.items()},
        "path": dg.MetadataValue.path(str(final)),
        "checkpoint": dg.MetadataValue.path(str(checkpoint_dir)),
    }
    check = eval_not_degenerate(context.asset_key, health, config.degenerate_failure(health))
    return result.metrics, check


def _read_eval_result(published: Path, eval_problems: pl.DataFrame, settings) -> EvalResult:
    """The completions a published eval generated, scored again (scoring is cheap and deterministic)."""
    from noisy_student_assets.core.evaluation import EvalResult, breakdown, score_problems, summarize

    greedy, sampled = pl.read_parquet(published / GREEDY_FILE), pl.read_parquet(published / SAMPLED_FILE)
    scores = score_problems(eval_problems, greedy, sampled, settings.ks)
    return EvalResult(scores=scores, metrics=summarize(scores, settings.ks), breakdown=breakdown(scores), greedy=greedy, sampled=sampled)


def read_eval(lake: DataLake, asset_key: dg.AssetKey, partition_key: str | None = None) -> tuple[dict, pl.DataFrame] | None:
    """The metrics and per-problem scores an eval asset published, or None if it has not been materialized."""
    directory = lake.artifact_dir(asset_key, partition_key)
    if not (directory / METRICS_FILE).exists():
        return None
    return json.loads((directory / METRICS_FILE).read_text())["metrics"], pl.read_parquet(directory / SCORES_FILE)


def read_report_table(lake: DataLake, asset_key: dg.AssetKey, partition_key: str | None, title: str) -> pl.DataFrame:
    """A table an eval report published (`ReportExtras.tables`), by its section title."""
    return pl.read_parquet(lake.artifact_dir(asset_key, partition_key) / f"{_metadata_key(title)}.parquet")


def _metadata_key(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")


def _report_markdown(title: str, lead: str, metrics: dict[str, float], tables: dict[str, pl.DataFrame]) -> str:
    rows = pl.DataFrame({"metric": list(metrics), "value": list(metrics.values())}, schema={"metric": pl.Utf8, "value": pl.Float64})
    parts = [f"# {title}", ""] + ([lead, ""] if lead else []) + [markdown_text(rows)]
    for section, table in tables.items():
        if table.height:
            parts += ["", f"## {section}", "", markdown_text(table)]
    return "\n".join(parts) + "\n"
