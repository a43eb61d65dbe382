"""One Noisy Student round per arm, as one asset per artifact (made by `round_definitions(n)`):

    teacher ──► round_00n/generations ──► round_00n/pseudo_labels ──► round_00n/student_checkpoint ──► round_00n/eval_report
    (labeled RL, or round n-1's student)                                ▲ teacher, generations,            ▲ audit, labeled-only eval,
                                                                        labeled problems                   previous report

Every read is a declared input or dependency, so the UI draws what fed what, and re-materializing
`round_002/pseudo_labels*` with a new tau re-runs only the vote, the student and what is downstream: the
generations are not an input of the vote's settings. Samples are also reused across arms: a sampling run
with the same content key (teacher weights, problems, settings, prompt format) is read back, not repeated.
"""

import json
from functools import partial
from pathlib import Path

import dagster as dg
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.checkpoints import weights_sha256
from noisy_student_assets.core.problems import fingerprint
from noisy_student_assets.core.prompts import prompt_template
from noisy_student_assets.core.pseudo_labels.labels import AUDIT_BUCKETS_FILE, AUDIT_FILE, label_floor_failure
from noisy_student_assets.defs.assets.metadata import markdown_table
from noisy_student_assets.defs.assets.models import BASE_MODEL, HEAVY_RETRY
from noisy_student_assets.defs.assets.stages import (
    ReportExtras,
    StageRun,
    evaluate,
    read_eval,
    read_report_table,
    stage,
    train_checkpoint,
)
from noisy_student_assets.defs.checks import (
    checkpoint_checks,
    eval_not_degenerate_spec,
    no_eval_regression,
    no_eval_regression_spec,
    pseudo_label_quality,
    pseudo_label_quality_spec,
)
from noisy_student_assets.defs.config import EvalConfig, PseudoLabelConfig, SamplingConfig, StudentConfig
from noisy_student_assets.defs.partitions import ARMS, round_group, round_key, teacher_key
from resources.compute import GPU_POOL
from resources.data_lake import CONTENT_KEY_FILE, TABLE_FILE_NAME, DataLake, LakeTable
from resources.stage_resources import StageResources

ACCURACY_TABLE = "Accuracy per round and chain"
"""A table of each round's eval report: greedy accuracy of the arm's checkpoints up to that round (the next
round's report extends it)."""


def round_definitions(number: int) -> dg.Definitions:
    """Round `number`'s assets and checks: generations, pseudo-labels, student checkpoint, eval report."""
    key = partial(round_key, number)
    generations_key, labels_key, student_key, report_key = (
        key(layout.GENERATIONS), key(layout.PSEUDO_LABELS), key(layout.STUDENT), key(layout.EVAL_REPORT)
    )
    teacher = dg.AssetIn(teacher_key(number), input_manager_key="checkpoint_io_manager")
    heavy = {"group_name": round_group(number), "partitions_def": ARMS, "pool": GPU_POOL, "retry_policy": HEAVY_RETRY}

    @dg.asset(
        key=generations_key,
        ins={"teacher": teacher, "unlabeled_problems": dg.AssetIn(layout.UNLABELED_PROBLEMS)},
        description="K samples per unlabeled problem from the round's teacher (parquet).",
        **heavy,
    )
    def generations(
        context: dg.AssetExecutionContext,
        config: SamplingConfig,
        teacher: Path,
        unlabeled_problems: pl.DataFrame,
        stage_resources: StageResources,
    ) -> dg.Output[LakeTable]:
        with stage(context, config, stage_resources, params={"teacher": str(teacher)}) as current:
            table = _sample(current, teacher, unlabeled_problems)
        return dg.Output(table, metadata=current.metadata)

    @dg.asset(
        key=labels_key,
        group_name=round_group(number),
        partitions_def=ARMS,
        ins={"generations": dg.AssetIn(generations_key), "unlabeled_problems": dg.AssetIn(layout.UNLABELED_PROBLEMS)},
        check_specs=[pseudo_label_quality_spec(labels_key)],
        description="Majority-vote answer over the round's generations, with agreement; `kept` where >= tau. "
        "Audited against the hidden gold.",
    )
    def pseudo_labels(
        context: dg.AssetExecutionContext,
        config: PseudoLabelConfig,
        generations: pl.DataFrame,
        unlabeled_problems: pl.DataFrame,
        stage_resources: StageResources,
    ):
        with stage(context, config, stage_resources) as current:
            table, check = _pseudo_label(current, generations, unlabeled_problems)
        yield dg.Output(table, metadata=current.metadata)
        yield check

    @dg.asset(
        key=student_key,
        io_manager_key="checkpoint_io_manager",
        ins={
            "teacher": teacher,
            "pseudo_labels": dg.AssetIn(labels_key),
            "generations": dg.AssetIn(generations_key),  # sft rows, dpo pairs and vote-share rewards come from them
            "labeled_problems": dg.AssetIn(layout.LABELED_PROBLEMS),
        },
        deps=[BASE_MODEL],  # the student's init when student_init=base_model
        description="The round's student, next round's teacher: from the teacher (or the base model), GRPO on labeled "
        "+ kept pseudo-labeled problems, or SFT / DPO on the teacher's samples that agree with the kept labels.",
        **heavy,
    )
    def student_checkpoint(
        context: dg.AssetExecutionContext,
        config: StudentConfig,
        teacher: Path,
        pseudo_labels: pl.DataFrame,
        generations: pl.DataFrame,
        labeled_problems: pl.DataFrame,
        stage_resources: StageResources,
    ) -> dg.Output[Path]:
        with stage(context, config, stage_resources) as current:
            kept = kept_pseudo_labels(current, pseudo_labels, labels_key)
            staged = train_from_student_init(current, teacher, labeled_problems, kept, generations)
        return dg.Output(staged, metadata=current.metadata | {"teacher": dg.MetadataValue.path(str(teacher))})

    earlier = round_key(number - 1, layout.EVAL_REPORT) if number > 1 else dg.AssetKey(layout.LABELED_RL_EVAL)
    labeled_only_eval = key(layout.control_eval(layout.LABELED_ONLY))

    @dg.asset(
        key=report_key,
        ins={
            "student": dg.AssetIn(student_key, input_manager_key="checkpoint_io_manager"),
            "eval_problems": dg.AssetIn(layout.EVAL_PROBLEMS),
        },
        deps=[labels_key, labeled_only_eval, earlier, dg.AssetKey(layout.LABELED_RL_EVAL), dg.AssetKey(layout.BASE_MODEL_EVAL)],
        check_specs=[no_eval_regression_spec(report_key), eval_not_degenerate_spec(report_key)],
        description="The round's student on eval_problems, and the verdict: its accuracy minus the labeled-only "
        "control's (same compute), with a paired bootstrap interval; deltas vs the previous round, labeled RL and "
        "the base model; pseudo-label calibration.",
        **heavy,
    )
    def eval_report(
        context: dg.AssetExecutionContext,
        config: EvalConfig,
        student: Path,
        eval_problems: pl.DataFrame,
        stage_resources: StageResources,
    ):
        arm, lake = context.partition_key, stage_resources.lake
        baselines = {
            "previous_round": read_eval(lake, earlier, arm) if number > 1 else None,
            "labeled_rl": read_eval(lake, dg.AssetKey(layout.LABELED_RL_EVAL), arm),
            "base_model": read_eval(lake, dg.AssetKey(layout.BASE_MODEL_EVAL)),
        }
        control = read_eval(lake, labeled_only_eval, arm)
        for needed, found in ((labeled_only_eval, control), (earlier, baselines["previous_round"] or baselines["labeled_rl"])):
            if found is None:
                raise dg.Failure(f"{needed.to_user_string()} (arm {arm}) is not materialized: the report compares with it")
        with stage(context, config, stage_resources) as current:
            metrics, health_check = evaluate(
                current,
                checkpoint_dir=student,
                eval_problems=eval_problems,
                deltas_against={name: found[0] for name, found in baselines.items() if found},
                extras=lambda metrics, scores: _report_extras(number, lake, arm, labels_key, earlier, metrics, scores, control),
            )
        yield dg.MaterializeResult(metadata=current.metadata)
        yield health_check
        reference_name = "previous_round" if baselines["previous_round"] else "labeled_rl"
        reference = baselines[reference_name]
        yield no_eval_regression(
            report_key,
            metrics["greedy_accuracy"],
            reference[0]["greedy_accuracy"] if reference else None,
            reference_name,
            current.config.regression_tolerance,
        )

    return dg.Definitions(
        assets=[generations, pseudo_labels, student_checkpoint, eval_report],
        asset_checks=checkpoint_checks(student_key, partitions_def=ARMS),
    )


def train_from_student_init(
    current: StageRun, teacher: Path, labeled: pl.DataFrame, pseudo_labeled: pl.DataFrame | None, generations: pl.DataFrame | None = None
) -> Path:
    """Train (`current.config`: a `StudentConfig`) from where the round's student (and the gold- and
    random-label controls) start: the teacher or the base model."""
    if current.config.student_init not in ("teacher", "base_model"):
        raise dg.Failure(f"student_init must be 'teacher' or 'base_model', got {current.config.student_init!r}", allow_retries=False)
    init = teacher if current.config.student_init == "teacher" else current.lake.artifact_dir(BASE_MODEL)
    return train_checkpoint(
        current, init_dir=init, labeled=labeled, pseudo_labeled=pseudo_labeled, generations=generations, student=current.config.to_settings()
    )


def kept_pseudo_labels(current: StageRun, labels: pl.DataFrame, labels_key: dg.AssetKey) -> pl.DataFrame:
    """The kept pseudo-labels within the config's agreement band, refused when their audit recorded a failed
    quality floor (the blocking check stops a run that made them; this stops one that materializes the
    student alone)."""
    from noisy_student_assets.core.pseudo_labels.student_data import in_agreement_band

    audit = json.loads(current.lake.read_sidecar(labels_key, current.partition, AUDIT_FILE) or "{}")
    if audit.get("floor_failure"):
        raise dg.Failure(
            f"{labels_key.to_user_string()} (arm {current.partition}) failed its quality floor: {audit['floor_failure']}; "
            "nothing is trained on them",
            allow_retries=False,  # the same labels would fail the same floor again
        )
    config = current.config
    kept = in_agreement_band(labels.filter("kept"), config.agreement_low, config.agreement_high)
    current.metadata["pseudo_labels_in_band"] = kept.height
    if kept.is_empty():  # only reachable with min_coverage=0 or a narrow band: the user chose to go on without them
        warning = (
            f"no pseudo-label reached tau={audit.get('tau')} within agreement [{config.agreement_low}, {config.agreement_high}]: "
            "trained on labeled problems only"
        )
        current.context.log.warning(warning)
        current.metadata["warning"] = warning
    return kept


def _sample(current: StageRun, teacher: Path, unlabeled: pl.DataFrame) -> LakeTable:
    """The teacher's K samples per problem, read back from any published sampling run with the same content key."""
    from noisy_student_assets.core.sampling import SampleShards, generate_samples_resumable, sampling_cache_key

    context, config, lake, compute = current.context, current.config, current.lake, current.resources.compute
    settings = config.to_settings()
    teacher_sha = weights_sha256(teacher)
    # Only the columns sampling reads: the hidden gold must not shape (or even key) the samples.
    problems = unlabeled.select("problem_id", "prompt")
    cache_key = sampling_cache_key(
        teacher_sha, fingerprint(problems), settings, config.backend, prompt_template(), config.batch_size
    )
    published = lake.recall(cache_key)
    stats = {}
    teacher_label = f"{teacher} sha256:{teacher_sha[:12]}"
    if published is not None:
        context.log.info(f"Reusing the samples of {published}: same teacher weights, problems, sampling settings")
        # Bit-identical weights sampled them: they are this teacher's samples, and say so.
        generations = pl.read_parquet(published / TABLE_FILE_NAME).with_columns(pl.lit(teacher_label).alias("checkpoint"))
    else:
        context.log.info(f"Sampling {settings.n} answers for {problems.height} problems from {teacher}")
        # Shards of an attempt killed midway (same cache key) are kept; this attempt samples the rest.
        shards = SampleShards(lake.work_dir(context.asset_key, current.partition, cache_key[:16]))
        with compute.exclusive(context.log.info), current.timed("sampling_seconds"):
            generations, resumed = generate_samples_resumable(
                teacher,
                problems,
                settings,
                shards,
                backend=config.backend,
                device=compute.resolved_device,
                dtype=compute.dtype,
                shard_size=config.shard_size,
                batch_size=config.batch_size,
                progress=lambda done, total: context.log.info(f"sampled {done}/{total} problems"),
                checkpoint_label=teacher_label,
                gpu_memory_utilization=compute.memory_share,
            )
        stats["resumed_problems"] = float(resumed)
        if resumed:
            context.log.info(f"Resumed {resumed}/{problems.height} problems from the shards of an interrupted attempt")
        else:  # tokens/s of an attempt that resumed would count tokens sampled by the one before
            stats["generated_tokens_per_second"] = generations["n_tokens"].sum() / current.metadata["sampling_seconds"]
        shards.clear()
    stats |= {
        "samples": generations.height,
        "answer_rate": generations["answer"].is_not_null().mean(),
        "truncated_rate": (generations["finish_reason"] == "length").mean(),
        "mean_tokens": generations["n_tokens"].mean(),
        "generated_tokens": float(generations["n_tokens"].sum()),
    }
    current.log_metrics(stats)
    current.metadata |= stats | {
        "reused_cached_samples": published is not None,
        **({"reused_from": dg.MetadataValue.path(str(published))} if published else {}),
        "cache_key": cache_key,
        "teacher": dg.MetadataValue.path(str(teacher)),
        "teacher_weights_sha256": teacher_sha,
        "sampling": dg.MetadataValue.json(settings.as_dict() | {"backend": config.backend}),
        "preview": markdown_table(generations.select("problem_id", "sample_index", "answer", "completion")),
    }
    return LakeTable(generations, {CONTENT_KEY_FILE: cache_key})


def _pseudo_label(current: StageRun, generations: pl.DataFrame, unlabeled: pl.DataFrame) -> tuple[LakeTable, dg.AssetCheckResult]:
    import mlflow

    from noisy_student_assets.core.pseudo_labels.labels import audit_pseudo_labels, vote_pseudo_labels

    config = current.config
    with current.timed("consensus_seconds"):
        labels = vote_pseudo_labels(generations, unlabeled, config.tau)
        audit = audit_pseudo_labels(labels, generations, unlabeled)
    kept = labels.filter("kept")
    stats = {
        "coverage": audit.coverage,
        "kept": float(kept.height),
        "mean_agreement": labels["agreement"].mean(),
        "kept_label_accuracy": audit.kept_label_accuracy if audit.kept_label_accuracy is not None else float("nan"),
        "all_label_accuracy": audit.all_label_accuracy if audit.all_label_accuracy is not None else float("nan"),
        "teacher_pass_at_1": audit.teacher_pass_at_1,
    }
    current.log_metrics(stats)
    mlflow.log_table(audit.buckets.to_pandas(), artifact_file="label_audit_by_agreement.json")
    failure = label_floor_failure(labels, config.tau, config.min_coverage, config.min_mean_agreement)
    check = pseudo_label_quality(
        current.context.asset_key, failure, audit.coverage, stats["mean_agreement"], config.min_coverage, config.min_mean_agreement
    )
    current.context.log.info(f"{kept.height}/{labels.height} pseudo-labels kept at tau={config.tau}; audit {stats}")
    current.metadata |= stats | {
        "tau": config.tau,
        "dagster/row_count": labels.height,
        "audit_by_agreement": markdown_table(audit.buckets, max_rows=audit.buckets.height),
        "preview": markdown_table(kept.select("problem_id", "pseudo_label", "agreement", "n_clusters")),
    }
    sidecars = {
        AUDIT_FILE: json.dumps(stats | {"tau": config.tau, "floor_failure": failure}),
        AUDIT_BUCKETS_FILE: audit.buckets.write_json(),
    }
    return LakeTable(labels, sidecars), check


def _report_extras(
    number: int,
    lake: DataLake,
    arm: str,
    labels_key: dg.AssetKey,
    earlier: dg.AssetKey,
    metrics: dict[str, float],
    scores: pl.DataFrame,
    control: tuple[dict, pl.DataFrame],
) -> ReportExtras:
    """The verdict against the labeled-only control, the arm's accuracy round by round (the previous report's
    table plus this round), and how well the round's pseudo-labels matched the hidden gold."""
    from noisy_student_assets.core.reporting import plots
    from noisy_student_assets.core.reporting.verdict import paired_difference, paired_scores
    from noisy_student_assets.core.training.compute import compute_comparison

    control_metrics, control_scores = control
    round_name = layout.round_prefix(number)
    difference = paired_difference(
        *paired_scores([(scores, control_scores)]),
        treatment_name=f"{round_name} (arm {arm})",
        control_name="its labeled-only control",
    )
    matched, compute_table = compute_comparison(metrics, control_metrics)
    lead = f"**Verdict.** {difference.sentence()} " + (
        "Both spent the same optimizer steps, prompts and completions since the base model."
        if matched
        else "**Not compute-matched**: see the compute table; the difference is not a gain at equal compute."
    )
    accuracy = _accuracy_by_round(number, lake, arm, earlier, metrics, control_metrics)
    extras = ReportExtras(
        metrics={
            "verdict/difference": difference.estimate,
            "verdict/ci_low": difference.low,
            "verdict/ci_high": difference.high,
            "verdict/compute_matched": float(matched),
        },
        figures={"accuracy_by_round": plots.accuracy_by_round(accuracy)},
        tables={ACCURACY_TABLE: accuracy, "Compute since the base model": compute_table},
        text=lead,
    )
    labels_dir = lake.artifact_dir(labels_key, arm)
    audit = json.loads((labels_dir / AUDIT_FILE).read_text())
    buckets = pl.read_json(labels_dir / AUDIT_BUCKETS_FILE)
    labels = lake.read_table(labels_key, arm)
    extras.figures["agreement_histogram"] = plots.agreement_histogram(labels["agreement"].to_list(), audit["tau"], int(labels["k"].max()))
    extras.figures["label_accuracy_vs_agreement"] = plots.label_accuracy_vs_agreement(buckets)
    extras.tables["Pseudo-label calibration"] = buckets  # label accuracy against the hidden gold by agreement
    extras.tables["Pseudo-label audit"] = pl.DataFrame([{k: v for k, v in audit.items() if k != "floor_failure"}])
    return extras


def _accuracy_by_round(
    number: int, lake: DataLake, arm: str, earlier: dg.AssetKey, metrics: dict[str, float], control_metrics: dict[str, float]
) -> pl.DataFrame:
    """Greedy accuracy of the arm's student and labeled-only chains up to round `number`: round 0 is labeled RL
    (both chains start there), with the base model beside it."""
    schema = {"round": pl.Int64, "checkpoint": pl.Utf8, "greedy_accuracy": pl.Float64}
    if number > 1:
        table = read_report_table(lake, earlier, arm, ACCURACY_TABLE)
    else:
        base, labeled_rl = read_eval(lake, dg.AssetKey(layout.BASE_MODEL_EVAL)), read_eval(lake, earlier, arm)
        table = pl.DataFrame(
            [
                {"round": 0, "checkpoint": layout.BASE_MODEL, "greedy_accuracy": base[0]["greedy_accuracy"] if base else None},
                {"round": 0, "checkpoint": layout.STUDENT_ROLE, "greedy_accuracy": labeled_rl[0]["greedy_accuracy"]},
                {"round": 0, "checkpoint": layout.LABELED_ONLY, "greedy_accuracy": labeled_rl[0]["greedy_accuracy"]},
            ],
            schema=schema,
        )
    return pl.concat([
        table,
        pl.DataFrame(
            [
                {"round": number, "checkpoint": layout.STUDENT_ROLE, "greedy_accuracy": metrics["greedy_accuracy"]},
                {"round": number, "checkpoint": layout.LABELED_ONLY, "greedy_accuracy": control_metrics["greedy_accuracy"]},
            ],
            schema=schema,
        ),
    ])
