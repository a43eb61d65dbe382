"""The heavy stages (GRPO training, evaluation) as the assets run them: logging to the Dagster run,
tracking in MLflow, publishing into the data lake. The ML libraries (and mlflow) are imported inside
the functions so that loading the code location (UI, CLI, `definitions validate`) stays fast."""

import hashlib
import json
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import polars as pl

from noisy_student_assets.assets.metadata import markdown_table, png_markdown
from noisy_student_assets.markdown import markdown_table as markdown_text
from noisy_student_assets.checkpoints import weights_sha256
from noisy_student_assets.checks import eval_not_degenerate
from noisy_student_assets.config import EvalConfig, GRPOTrainingConfig, resolved_config
from noisy_student_assets.evaluation import METRICS_FILE
from noisy_student_assets.problems import fingerprint
from noisy_student_assets.prompts import DEFAULT_SYSTEM_PROMPT
from resources.compute import ComputeResource
from resources.data_lake import DataLake
from resources.tracking import MlflowTracking

REPORT_FILE = "report.md"


@dataclass(frozen=True)
class ReportExtras:
    """What an eval asset adds to its report once its checkpoint's metrics are known."""

    metrics: dict[str, float] = field(default_factory=dict)
    figures: dict[str, bytes] = field(default_factory=dict)
    """File stem -> PNG: stored in the report dir, inlined in the metadata, logged to MLflow."""
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    """Section title -> table: in report.md and as its own metadata entry."""


def _partition(context: dg.AssetExecutionContext) -> str | None:
    return context.partition_key if context.has_partition_key else None


def _dagster_log_callback(context: dg.AssetExecutionContext):
    """A TrainerCallback that writes TRL's step logs (loss, reward, ...) into the Dagster run log."""
    from transformers import TrainerCallback

    class DagsterLogCallback(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            shown = {k: round(v, 4) for k, v in (logs or {}).items() if isinstance(v, float)}
            context.log.info(f"step {state.global_step}/{state.max_steps}: {shown}")

    return DagsterLogCallback()


def train_checkpoint(
    context: dg.AssetExecutionContext,
    asset_name: str,
    *,
    init_dir: Path,
    labeled: pl.DataFrame,
    pseudo_labeled: pl.DataFrame | None,
    grpo: GRPOTrainingConfig,
    run_config: dict,
    compute: ComputeResource,
    tracking: MlflowTracking,
    lake: DataLake,
) -> tuple[Path, dict]:
    """GRPO from `init_dir` on labeled (+ pseudo-labeled) problems into a staged checkpoint directory.

    `run_config` is the asset's resolved config (`config.resolved_config`), logged as MLflow params and
    metadata. Returns the staged directory (for the checkpoint IO manager or `DataLake.publish`) and
    metadata. Steps with a non-finite loss or gradient norm are skipped and logged as warnings; too many
    in a row, or a trained checkpoint with non-finite weights, fail the asset before anything is published.
    """
    import mlflow

    from noisy_student_assets.training import build_training_dataset, train_grpo

    settings = grpo.to_settings()
    dataset = build_training_dataset(labeled, pseudo_labeled, DEFAULT_SYSTEM_PROMPT, seed=settings.seed)
    init_sha = weights_sha256(init_dir)
    # TRL checkpoints live in a work dir keyed by everything that shapes the run, so a retry after a
    # crash resumes the same run and a changed input never resumes a stale one.
    run_fingerprint = hashlib.sha256(
        json.dumps([init_sha, dataset.to_list(), settings.as_dict()], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    work_dir = lake.work_dir(asset_name, _partition(context), run_fingerprint)
    staged = lake.staging_dir()
    params = {"config": run_config, "init_checkpoint": str(init_dir), "init_weights_sha256": init_sha}
    context.log.info(f"GRPO from {init_dir} on {len(dataset)} problems for {settings.max_steps} steps")
    with tracking.start_run(context, asset_name, params) as run, compute.exclusive(context.log.info):
        started = time.perf_counter()
        result = train_grpo(
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
        training_seconds = time.perf_counter() - started
        mlflow.log_metrics({f"final/{k}": v for k, v in result.metrics.items()} | {"training_seconds": training_seconds})
    shutil.rmtree(work_dir, ignore_errors=True)  # resumable state is only for a crashed attempt
    metadata = {
        "init_checkpoint": dg.MetadataValue.path(str(init_dir)),
        "init_weights_sha256": init_sha,
        "weights_sha256": weights_sha256(staged),
        "train_rows": result.n_train_rows,
        "gold_rows": result.n_gold_rows,
        "pseudo_rows": result.n_pseudo_rows,
        "mlflow_run_id": run.info.run_id,
        "grpo_settings": dg.MetadataValue.json(settings.as_dict()),
        "config": dg.MetadataValue.json(run_config),
        "training_seconds": training_seconds,
        **{k: float(v) for k, v in result.metrics.items()},
    }
    return staged, metadata


def evaluate(
    context: dg.AssetExecutionContext,
    asset_name: str,
    *,
    checkpoint_dir: Path,
    eval_problems: pl.DataFrame,
    config: EvalConfig,
    compute: ComputeResource,
    tracking: MlflowTracking,
    lake: DataLake,
    deltas_against: dict[str, dict] | None = None,
    extras: Callable[[dict[str, float]], ReportExtras] | None = None,
) -> tuple[dict[str, float], dict, dg.AssetCheckResult]:
    """Evaluate `checkpoint_dir` on `eval_problems`; publish the report directory (per-problem scores,
    breakdown, metrics.json, report.md, figures) as this asset's artifact. Returns the metrics, the
    metadata and the `eval_not_degenerate` check's result (answer, truncation and identical-completion
    rates of the greedy outputs against the thresholds in `config`).

    `deltas_against` maps a name ("previous_round", "labeled_rl", "base_model") to that checkpoint's
    metrics; the report adds the differences for every shared metric. `extras`, given the metrics,
    returns further metrics, figures and tables for the report.
    """
    import mlflow

    from noisy_student_assets.evaluation import evaluate_checkpoint

    from noisy_student_assets.guards import output_health

    settings = config.to_settings()
    run_config = resolved_config(config)
    params = {"config": run_config, "checkpoint": str(checkpoint_dir)}
    with tracking.start_run(context, asset_name, params) as run:
        with compute.exclusive(context.log.info):
            started = time.perf_counter()
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
            eval_seconds = time.perf_counter() - started
        health = output_health(result.greedy)
        metrics = dict(result.metrics) | health.as_dict()
        for name, other in (deltas_against or {}).items():
            metrics |= {f"delta_vs_{name}/{k}": v - other[k] for k, v in result.metrics.items() if k in other and k != "problems"}
        added = extras(metrics) if extras else ReportExtras()
        metrics |= added.metrics
        tables = {"By subject / level": result.breakdown} | added.tables
        report = _report_markdown(asset_name, _partition(context), metrics, tables, list(added.figures))
        staged = lake.staging_dir()
        result.scores.write_parquet(staged / "scores.parquet")
        result.breakdown.write_parquet(staged / "breakdown.parquet")
        for stem, png in added.figures.items():
            (staged / f"{stem}.png").write_bytes(png)
        (staged / METRICS_FILE).write_text(
            json.dumps({"metrics": metrics, "settings": params, "eval_problems": fingerprint(eval_problems)}, indent=2)
        )
        (staged / REPORT_FILE).write_text(report)
        mlflow.log_metrics({_mlflow_name(k): v for k, v in metrics.items()} | {"eval_seconds": eval_seconds})
        mlflow.log_artifacts(str(staged), artifact_path="eval_report")
    final = lake.publish(staged, context.asset_key, _partition(context))
    metadata = {
        **{k: float(v) for k, v in metrics.items()},
        "report": dg.MetadataValue.md(report),
        **{stem: png_markdown(stem, png) for stem, png in added.figures.items()},
        **{_metadata_key(title): markdown_table(table, max_rows=None) for title, table in added.tables.items()},
        "path": dg.MetadataValue.path(str(final)),
        "checkpoint": dg.MetadataValue.path(str(checkpoint_dir)),
        "eval_seconds": eval_seconds,
        "config": dg.MetadataValue.json(run_config),
        "mlflow_run_id": run.info.run_id,
    }
    check = eval_not_degenerate(asset_name, health, config.degenerate_failure(health))
    return result.metrics, metadata, check


def read_eval_metrics(lake: DataLake, asset_key: dg.AssetKey, partition_key: str | None = None) -> dict | None:
    """The metrics an eval asset published, or None if it has not been materialized."""
    path = lake.artifact_dir(asset_key, partition_key) / METRICS_FILE
    return json.loads(path.read_text())["metrics"] if path.exists() else None


def _mlflow_name(metric: str) -> str:
    # MLflow metric names allow letters, digits, _ - . / and space; "maj@8" becomes "maj_at_8".
    return metric.replace("@", "_at_")


def _metadata_key(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")


def _report_markdown(
    asset_name: str, partition: str | None, metrics: dict[str, float], tables: dict[str, pl.DataFrame], figures: list[str]
) -> str:
    title = f"# {asset_name}" + (f" ({partition})" if partition else "")
    rows = pl.DataFrame({"metric": list(metrics), "value": list(metrics.values())}, schema={"metric": pl.Utf8, "value": pl.Float64})
    parts = [title, "", markdown_text(rows)]
    for section, table in tables.items():
        if table.height:
            parts += ["", f"## {section}", "", markdown_text(table)]
    parts += [f"\n![{stem}]({stem}.png)" for stem in figures]
    return "\n".join(parts) + "\n"
