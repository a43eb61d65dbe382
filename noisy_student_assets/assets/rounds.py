"""One Noisy Student round per partition: the teacher's K samples, the consensus pseudo-labels, the
student trained on labeled + pseudo-labeled problems, and the student's eval report.

Round N's teacher is round N-1's student, so generations -> pseudo_labels -> student_checkpoint ->
(next round's) generations is a loop over asset keys, which Dagster rejects. The three are therefore
one multi-asset whose student depends on its own previous partition; backfills then run the rounds
in order (see ../../README.md, "Rounds in Dagster"). The multi-asset is not subsettable: a subset run
would let a backfill sample round N before round N-1's student exists. Re-materializing it with new
consensus settings does not resample: the generations are reused when teacher weights, problems and
sampling settings are unchanged (their cache key is stored beside them).
"""

import json
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import polars as pl

from noisy_student_assets.assets.metadata import markdown_table
from noisy_student_assets.assets.models import HEAVY_RETRY
from noisy_student_assets.assets.stages import ReportExtras, evaluate, read_eval_metrics, train_checkpoint
from noisy_student_assets.checks import (
    NO_EVAL_REGRESSION,
    PSEUDO_LABEL_QUALITY,
    checkpoint_checks,
    eval_not_degenerate_spec,
    no_eval_regression,
    pseudo_label_quality,
)
from noisy_student_assets.checkpoints import weights_sha256
from noisy_student_assets.config import EvalConfig, RoundConfig, resolved_config
from noisy_student_assets.partitions import PREVIOUS_ROUND, ROUNDS, previous_round_key
from noisy_student_assets.problems import fingerprint
from noisy_student_assets.pseudo_labels import AUDIT_BUCKETS_FILE, AUDIT_FILE, label_floor_failure
from noisy_student_assets.prompts import prompt_template
from resources.compute import GPU_POOL, ComputeResource
from resources.data_lake import DataLake
from resources.tracking import MlflowTracking

GROUP = "rounds"
GENERATIONS = dg.AssetKey("generations")
PSEUDO_LABELS = dg.AssetKey("pseudo_labels")
STUDENT = dg.AssetKey("student_checkpoint")
CACHE_KEY_FILE = "cache_key.txt"


def teacher_checkpoint(lake: DataLake, round_key: str) -> Path:
    """Round 1's teacher is the labeled-RL checkpoint; round N's is round N-1's student."""
    previous = previous_round_key(round_key)
    path = lake.artifact_dir(STUDENT, previous) if previous else lake.artifact_dir(dg.AssetKey("labeled_rl_checkpoint"))
    if not (path / "config.json").exists():
        missing = f"student_checkpoint {previous}" if previous else "labeled_rl_checkpoint"
        raise dg.Failure(
            f"{round_key} needs its teacher, {missing}, which is not materialized: materialize it first",
            allow_retries=False,
        )
    return path


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            GENERATIONS,
            deps=["unlabeled_problems", "labeled_rl_checkpoint"],
            description="K samples per unlabeled problem from the round's teacher (parquet).",
        ),
        # No declared edge from generations: with it, Dagster 1.13's asset backfill of several rounds fails
        # on its first tick ("At least one run should be requested...") depending on hash order. Both are
        # made by this one op anyway, and the metadata names the generations' cache key.
        dg.AssetSpec(
            PSEUDO_LABELS,
            deps=["unlabeled_problems"],
            description="Majority-vote answer over the round's generations, with agreement; `kept` where >= tau.",
        ),
        dg.AssetSpec(
            STUDENT,
            deps=[PSEUDO_LABELS, "labeled_problems", dg.AssetDep(STUDENT, partition_mapping=PREVIOUS_ROUND)],
            description="GRPO on labeled + kept pseudo-labeled problems: the round's student, next round's teacher.",
        ),
    ],
    check_specs=[PSEUDO_LABEL_QUALITY],
    partitions_def=ROUNDS,
    group_name=GROUP,
    pool=GPU_POOL,
    retry_policy=HEAVY_RETRY,
)
def noisy_student_round(
    context: dg.AssetExecutionContext,
    config: RoundConfig,
    compute: ComputeResource,
    tracking: MlflowTracking,
    data_lake: DataLake,
) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
    round_key = context.partition_key
    teacher = teacher_checkpoint(data_lake, round_key)
    unlabeled = data_lake.read_table(dg.AssetKey("unlabeled_problems"))
    labeled = data_lake.read_table(dg.AssetKey("labeled_problems"))

    generations, generation_metadata = _sample(context, config, teacher, unlabeled, compute, tracking, data_lake)
    yield dg.MaterializeResult(asset_key=GENERATIONS, metadata=generation_metadata)

    pseudo_labels, label_metadata, check = _pseudo_label(context, config, generations, unlabeled, tracking, data_lake)
    yield dg.MaterializeResult(asset_key=PSEUDO_LABELS, metadata=label_metadata)
    yield check
    if not check.passed:
        raise dg.Failure(
            f"{round_key}: pseudo-labels failed their quality floor: {check.description}; the student is not trained on them",
            metadata=check.metadata,
            allow_retries=False,  # the same samples would fail the same floor again
        )

    no_labels_kept = not pseudo_labels["kept"].any()
    if no_labels_kept:  # only reachable with min_coverage=0: the user chose to go on without them
        context.log.warning(f"{round_key}: no pseudo-label reached tau={config.tau}; the student trains on labeled problems only")
    init = teacher if config.student_init == "teacher" else data_lake.artifact_dir(dg.AssetKey("base_model"))
    staged, student_metadata = train_checkpoint(
        context,
        "student_checkpoint",
        init_dir=init,
        labeled=labeled,
        pseudo_labeled=pseudo_labels.filter("kept"),
        grpo=config.grpo,
        run_config=resolved_config(config),
        compute=compute,
        tracking=tracking,
        lake=data_lake,
    )
    final = data_lake.publish(staged, STUDENT, round_key)
    yield dg.MaterializeResult(
        asset_key=STUDENT,
        metadata=student_metadata
        | {"path": dg.MetadataValue.path(str(final)), "teacher": dg.MetadataValue.path(str(teacher))}
        | ({"warning": f"no pseudo-label reached tau={config.tau}: trained on labeled problems only"} if no_labels_kept else {}),
    )


def _sample(
    context: dg.AssetExecutionContext,
    config: RoundConfig,
    teacher: Path,
    unlabeled: pl.DataFrame,
    compute: ComputeResource,
    tracking: MlflowTracking,
    lake: DataLake,
) -> tuple[pl.DataFrame, dict]:
    """The teacher's K samples per problem, reused from the published artifact when its cache key matches."""
    import mlflow

    from noisy_student_assets.generation import SampleShards, generate_samples_resumable, sampling_cache_key

    settings = config.sampling.to_settings()
    teacher_sha = weights_sha256(teacher)
    # Only the columns sampling reads: the hidden gold must not shape (or even key) the samples.
    problems = unlabeled.select("problem_id", "prompt")
    cache_key = sampling_cache_key(
        teacher_sha, fingerprint(problems), settings, config.sampling.backend, prompt_template(), config.sampling.batch_size
    )
    published = lake.artifact_dir(GENERATIONS, context.partition_key)
    reused = (published / CACHE_KEY_FILE).exists() and (published / CACHE_KEY_FILE).read_text() == cache_key
    params = {"config": resolved_config(config), "teacher": str(teacher), "cache_key": cache_key}
    with tracking.start_run(context, "generations", params) as run:
        if reused:
            context.log.info(f"Reusing generations with cache key {cache_key} (same teacher, problems, sampling)")
            generations = lake.read_table(GENERATIONS, context.partition_key)
        else:
            context.log.info(f"Sampling {settings.n} answers for {problems.height} problems from {teacher}")
            # Shards of an attempt killed midway (same cache key) are kept; this attempt samples the rest.
            shards = SampleShards(lake.work_dir(GENERATIONS.path[-1], context.partition_key, cache_key[:16]))
            with compute.exclusive(context.log.info):
                started = time.perf_counter()
                generations, resumed = generate_samples_resumable(
                    teacher,
                    problems,
                    settings,
                    shards,
                    backend=config.sampling.backend,
                    device=compute.resolved_device,
                    dtype=compute.dtype,
                    shard_size=config.sampling.shard_size,
                    batch_size=config.sampling.batch_size,
                    progress=lambda done, total: context.log.info(f"sampled {done}/{total} problems"),
                    checkpoint_label=f"{teacher} sha256:{teacher_sha[:12]}",
                    gpu_memory_utilization=compute.memory_share,
                )
                timing = {"sampling_seconds": time.perf_counter() - started, "resumed_problems": float(resumed)}
            if resumed:
                context.log.info(f"Resumed {resumed}/{problems.height} problems from the shards of an interrupted attempt")
            else:  # tokens/s of an attempt that resumed would count tokens sampled by the one before
                timing["generated_tokens_per_second"] = generations["n_tokens"].sum() / timing["sampling_seconds"]
            lake.write_table(generations, GENERATIONS, context.partition_key, extra_files={CACHE_KEY_FILE: cache_key})
            shards.clear()
        stats = {
            "samples": generations.height,
            "answer_rate": generations["answer"].is_not_null().mean(),
            "truncated_rate": (generations["finish_reason"] == "length").mean(),
            "mean_tokens": generations["n_tokens"].mean(),
            **({} if reused else timing),
        }
        mlflow.log_metrics(stats)
    return generations, {
        **stats,
        "dagster/row_count": generations.height,
        "reused_cached_samples": reused,
        "cache_key": cache_key,
        "teacher": dg.MetadataValue.path(str(teacher)),
        "teacher_weights_sha256": teacher_sha,
        "sampling": dg.MetadataValue.json(settings.as_dict() | {"backend": config.sampling.backend}),
        "config": dg.MetadataValue.json(params["config"]),
        "path": dg.MetadataValue.path(str(published)),
        "preview": markdown_table(generations.select("problem_id", "sample_index", "answer", "completion")),
        "mlflow_run_id": run.info.run_id,
    }


def _pseudo_label(
    context: dg.AssetExecutionContext,
    config: RoundConfig,
    generations: pl.DataFrame,
    unlabeled: pl.DataFrame,
    tracking: MlflowTracking,
    lake: DataLake,
) -> tuple[pl.DataFrame, dict, dg.AssetCheckResult]:
    import mlflow

    from noisy_student_assets.pseudo_labels import audit_pseudo_labels, vote_pseudo_labels

    with tracking.start_run(context, "pseudo_labels", {"config": resolved_config(config)}) as run:
        started = time.perf_counter()
        labels = vote_pseudo_labels(generations, unlabeled, config.tau)
        audit = audit_pseudo_labels(labels, generations, unlabeled)
        consensus_seconds = time.perf_counter() - started
        kept = labels.filter("kept")
        stats = {
            "coverage": audit.coverage,
            "kept": float(kept.height),
            "mean_agreement": labels["agreement"].mean(),
            "kept_label_accuracy": audit.kept_label_accuracy if audit.kept_label_accuracy is not None else float("nan"),
            "all_label_accuracy": audit.all_label_accuracy if audit.all_label_accuracy is not None else float("nan"),
            "teacher_pass_at_1": audit.teacher_pass_at_1,
        }
        mlflow.log_metrics(stats | {"consensus_seconds": consensus_seconds})
        mlflow.log_table(audit.buckets.to_pandas(), artifact_file="label_audit_by_agreement.json")
        path = lake.write_table(
            labels,
            PSEUDO_LABELS,
            context.partition_key,
            extra_files={AUDIT_FILE: json.dumps(stats | {"tau": config.tau}), AUDIT_BUCKETS_FILE: audit.buckets.write_json()},
        )
    check = pseudo_label_quality(
        label_floor_failure(labels, config.tau, config.min_coverage, config.min_mean_agreement),
        audit.coverage, stats["mean_agreement"], config.min_coverage, config.min_mean_agreement,
    )
    context.log.info(f"{kept.height}/{labels.height} pseudo-labels kept at tau={config.tau}; audit {stats}")
    return labels, {
        **stats,
        "consensus_seconds": consensus_seconds,
        "tau": config.tau,
        "generations_cache_key": (lake.artifact_dir(GENERATIONS, context.partition_key) / CACHE_KEY_FILE).read_text(),
        "dagster/row_count": labels.height,
        "audit_by_agreement": markdown_table(audit.buckets, max_rows=audit.buckets.height),
        "preview": markdown_table(kept.select("problem_id", "pseudo_label", "agreement", "n_clusters")),
        "path": dg.MetadataValue.path(str(path)),
        "mlflow_run_id": run.info.run_id,
    }, check


@dg.asset(
    partitions_def=ROUNDS,
    group_name=GROUP,
    pool=GPU_POOL,
    retry_policy=HEAVY_RETRY,
    deps=[
        STUDENT,
        "labeled_rl_eval",
        "base_model_eval",
        "gold_label_rl_eval",
        dg.AssetDep("eval_report", partition_mapping=PREVIOUS_ROUND),
    ],
    check_specs=[NO_EVAL_REGRESSION, eval_not_degenerate_spec("eval_report")],
)
def eval_report(
    context: dg.AssetExecutionContext,
    config: EvalConfig,
    eval_problems: pl.DataFrame,
    compute: ComputeResource,
    tracking: MlflowTracking,
    data_lake: DataLake,
) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
    """The round's student on eval_problems, with deltas vs the previous round, labeled RL and the base model;
    accuracy of every checkpoint so far, the round's pseudo-label calibration, and the share of the
    gold-label control's gain recovered (once `gold_label_rl_eval` exists)."""
    round_key = context.partition_key
    previous = previous_round_key(round_key)
    baselines = {
        "previous_round": read_eval_metrics(data_lake, context.asset_key, previous) if previous else None,
        "labeled_rl": read_eval_metrics(data_lake, dg.AssetKey("labeled_rl_eval")),
        "base_model": read_eval_metrics(data_lake, dg.AssetKey("base_model_eval")),
    }
    metrics, metadata, health_check = evaluate(
        context,
        "eval_report",
        checkpoint_dir=data_lake.artifact_dir(STUDENT, round_key),
        eval_problems=eval_problems,
        config=config,
        compute=compute,
        tracking=tracking,
        lake=data_lake,
        deltas_against={name: found for name, found in baselines.items() if found},
        extras=lambda metrics: _round_report_extras(data_lake, round_key, metrics),
    )
    yield dg.MaterializeResult(metadata=metadata)
    yield health_check
    reference_name = "previous_round" if baselines["previous_round"] else "labeled_rl"
    reference = baselines[reference_name]
    yield no_eval_regression(
        metrics["greedy_accuracy"],
        reference["greedy_accuracy"] if reference else None,
        reference_name,
        config.regression_tolerance,
    )


student_checkpoint_checks = checkpoint_checks(STUDENT.path[-1], partitions_def=ROUNDS)


def _round_report_extras(lake: DataLake, round_key: str, metrics: dict[str, float]) -> ReportExtras:
    """Figures and tables that put the round in context: every checkpoint evaluated up to this round,
    and how well its pseudo-labels matched the hidden gold by agreement."""
    from noisy_student_assets import plots
    from noisy_student_assets.summary import accuracy_table, checkpoint_order, gold_gain_shares, load_metrics

    so_far = {name: m for name, m in load_metrics(lake.root_path).items() if not name.startswith("round-") or name < round_key}
    checkpoints = dict(sorted((so_far | {round_key: metrics}).items(), key=lambda item: checkpoint_order(item[0])))
    accuracy = accuracy_table(checkpoints)
    extras = ReportExtras(
        figures={"accuracy_by_checkpoint": plots.accuracy_by_checkpoint(accuracy)},
        tables={"Accuracy per checkpoint": accuracy.drop("seed")},
    )
    shares = gold_gain_shares(checkpoints)
    if shares:
        extras.metrics["share_of_gold_gain"] = shares[round_key]
    labels_dir = lake.artifact_dir(PSEUDO_LABELS, round_key)
    if (labels_dir / AUDIT_BUCKETS_FILE).exists():
        audit = json.loads((labels_dir / AUDIT_FILE).read_text())
        buckets = pl.read_json(labels_dir / AUDIT_BUCKETS_FILE)
        labels = lake.read_table(PSEUDO_LABELS, round_key)
        extras.figures["agreement_histogram"] = plots.agreement_histogram(
            labels["agreement"].to_list(), audit["tau"], int(labels["k"].max())
        )
        extras.figures["label_accuracy_vs_agreement"] = plots.label_accuracy_vs_agreement(buckets)
        extras.tables["Pseudo-label calibration"] = buckets  # label accuracy against the hidden gold by agreement
        extras.tables["Pseudo-label audit"] = pl.DataFrame([audit])
    return extras
