"""Asset checks.

Two kinds: checks the assets that own the data evaluate themselves and report as check results (so a
failing floor can stop a round before training on garbage), and checks of their own, built here for
every checkpoint asset, that read the published checkpoint. Checks that guard what runs downstream are
blocking: when one fails with ERROR severity, Dagster skips the assets downstream of it in that run.
"""

import dagster as dg
import polars as pl

from noisy_student_assets.assets.metadata import markdown_table
from noisy_student_assets.config import SmokeConfig
from noisy_student_assets.guards import OutputHealth, non_finite_tensors, output_health, smoke_failure
from resources.compute import GPU_POOL, ComputeResource
from resources.data_lake import DataLake

PSEUDO_LABEL_QUALITY = dg.AssetCheckSpec(
    "pseudo_label_quality",
    asset="pseudo_labels",
    blocking=True,  # the round also stops itself before training when it fails
    description="Coverage at tau and mean agreement are above their configured floors.",
)
NO_EVAL_REGRESSION = dg.AssetCheckSpec(
    "no_eval_regression",
    asset="eval_report",
    description="Greedy accuracy did not drop more than the tolerance below the previous round (or labeled RL).",
)
EVAL_NOT_DEGENERATE = "eval_not_degenerate"
FINITE_WEIGHTS = "finite_weights"
SMOKE_GENERATION = "smoke_generation"


def eval_not_degenerate_spec(asset: str) -> dg.AssetCheckSpec:
    """The check every eval asset reports: its greedy outputs are not degenerate (thresholds in EvalConfig)."""
    return dg.AssetCheckSpec(
        EVAL_NOT_DEGENERATE,
        asset=asset,
        blocking=True,
        description="Greedy completions have answers, mostly end by themselves and differ between problems "
        "(a broken model scores 0.0 by running every completion to the token limit).",
    )


def eval_not_degenerate(asset: str, health: OutputHealth, failure: str | None) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=EVAL_NOT_DEGENERATE,
        asset_key=dg.AssetKey(asset),
        passed=failure is None,
        description=failure,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata=health.as_dict(),
    )


def pseudo_label_quality(
    failure: str | None, coverage: float, mean_agreement: float, min_coverage: float, min_agreement: float
) -> dg.AssetCheckResult:
    """ERROR when too few labels survive tau, or the teacher agrees with itself too rarely to trust them
    (`failure`: why, from `pseudo_labels.label_floor_failure`)."""
    return dg.AssetCheckResult(
        check_name=PSEUDO_LABEL_QUALITY.name,
        asset_key=PSEUDO_LABEL_QUALITY.asset_key,
        passed=failure is None,
        description=failure,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "coverage": coverage,
            "min_coverage": min_coverage,
            "mean_agreement": mean_agreement,
            "min_agreement": min_agreement,
        },
    )


def no_eval_regression(accuracy: float, previous_accuracy: float | None, previous_name: str, tolerance: float) -> dg.AssetCheckResult:
    """WARN when greedy accuracy fell by more than `tolerance` against the previous checkpoint."""
    passed = previous_accuracy is None or accuracy >= previous_accuracy - tolerance
    return dg.AssetCheckResult(
        check_name=NO_EVAL_REGRESSION.name,
        asset_key=NO_EVAL_REGRESSION.asset_key,
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "greedy_accuracy": accuracy,
            "previous": previous_name,
            "previous_greedy_accuracy": previous_accuracy if previous_accuracy is not None else float("nan"),
            "tolerance": tolerance,
        },
    )


def checkpoint_checks(
    asset: str, partitions_def: dg.PartitionsDefinition | None = None
) -> list[dg.AssetChecksDefinition]:
    """Blocking checks of the published checkpoint of `asset`: every weight is finite, and a short greedy
    generation on the first eval prompts yields text that does not all run to the token limit.

    The checkpoint's own asset already refuses to publish non-finite weights; `finite_weights` makes the
    verdict visible in the UI and catches a checkpoint changed or placed in the lake by other means.
    """
    asset_key = dg.AssetKey(asset)

    def checkpoint_dir(context: dg.AssetCheckExecutionContext, data_lake: DataLake):
        partition = context.partition_key if partitions_def is not None else None
        path = data_lake.artifact_dir(asset_key, partition)
        if not (path / "config.json").exists():
            raise dg.Failure(f"{asset}{f' {partition}' if partition else ''} has no checkpoint at {path}")
        return path

    @dg.asset_check(
        asset=asset_key,
        name=FINITE_WEIGHTS,
        blocking=True,
        partitions_def=partitions_def,
        description="Every tensor of the published checkpoint is finite (no NaN, no inf).",
    )
    def finite_weights(context: dg.AssetCheckExecutionContext, data_lake: DataLake) -> dg.AssetCheckResult:
        bad, total = non_finite_tensors(checkpoint_dir(context, data_lake))
        return dg.AssetCheckResult(
            passed=not bad,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"{len(bad)} of {total} tensors hold NaN or inf: {', '.join(bad[:5])}" if bad else None,
            metadata={"tensors": total, "non_finite_tensors": len(bad)},
        )

    @dg.asset_check(
        asset=asset_key,
        name=SMOKE_GENERATION,
        blocking=True,
        partitions_def=partitions_def,
        pool=GPU_POOL,
        additional_ins={"eval_problems": dg.AssetIn("eval_problems")},
        description="Greedy completions of the first eval prompts are not empty and do not all run to the token limit.",
    )
    def smoke_generation(
        context: dg.AssetCheckExecutionContext,
        config: SmokeConfig,
        eval_problems: pl.DataFrame,
        data_lake: DataLake,
        compute: ComputeResource,
    ) -> dg.AssetCheckResult:
        from noisy_student_assets.generation import SamplingSettings, generate_samples

        directory = checkpoint_dir(context, data_lake)
        with compute.exclusive(context.log.info):
            completions = generate_samples(
                directory,
                eval_problems.head(config.prompts),
                SamplingSettings(n=1, temperature=0.0, max_new_tokens=config.max_new_tokens),
                backend="transformers",
                device=compute.resolved_device,
                dtype=compute.dtype,
            )
        health = output_health(completions)
        failure = smoke_failure(
            health, max_empty_rate=config.max_empty_rate, max_truncation_rate=config.max_truncation_rate
        )
        return dg.AssetCheckResult(
            passed=failure is None,
            severity=dg.AssetCheckSeverity.ERROR,
            description=failure,
            metadata=health.as_dict()
            | {"completions": markdown_table(completions.select("problem_id", "finish_reason", "n_tokens", "completion"), max_rows=None)},
        )

    return [finite_weights, smoke_generation]
