"""Asset checks.

Two kinds: checks the assets that own the data evaluate themselves and report as check results (so a
failing floor can stop a round before training on garbage), and checks of their own, built here for
every checkpoint asset, that read the published checkpoint. Checks that guard what runs downstream are
blocking: when one fails with ERROR severity, Dagster skips the assets downstream of it in that run.
"""

import warnings

import dagster as dg
import polars as pl

from noisy_student_assets.core.layout import COMPUTE_FILE, EVAL_PROBLEMS
from noisy_student_assets.core.training.compute import UNRECORDED_RECIPE, read_compute, recipe_mismatches
from noisy_student_assets.core.training.guards import OutputHealth, non_finite_tensors
from noisy_student_assets.defs.assets.metadata import markdown_table
from noisy_student_assets.defs.config import SmokeConfig
from noisy_student_assets.defs.partitions import ARMS
from resources.compute import DEVICE_POOL, ComputeResource
from resources.data_lake import DataLake

# a preview API of Dagster's that the checks of a partitioned asset need: its warning would print on every load
warnings.filterwarnings(
    "ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning
)

PSEUDO_LABEL_QUALITY = "pseudo_label_quality"
NO_EVAL_REGRESSION = "no_eval_regression"
EVAL_NOT_DEGENERATE = "eval_not_degenerate"
FINITE_WEIGHTS = "finite_weights"
SMOKE_GENERATION = "smoke_generation"
COMPUTE_MATCHED = "compute_matched"
VERIFIER_INFORMATIVE = "verifier_informative"


REPORTED_CHECKS = {
    # the student also refuses labels whose audit records a failed floor
    PSEUDO_LABEL_QUALITY: "Blocking: coverage at tau and mean agreement are above their configured floors; below them "
    "the round's student is not trained.",
    NO_EVAL_REGRESSION: "Warns when greedy accuracy dropped more than the tolerance below the previous round (or "
    "labeled RL).",
    EVAL_NOT_DEGENERATE: "Blocking: greedy completions have answers, mostly end by themselves and differ between "
    "problems (a broken model scores 0.0 by running every completion to the token limit).",
    VERIFIER_INFORMATIVE: "Blocking: the verifier's scores of the validation problems' samples are finite, not all "
    "the same, and rank right samples above wrong ones beyond chance (the AUROC's 95% interval, resampling problems, "
    "lies above 0.5); otherwise its votes would be noise and nothing downstream runs.",
}
"""The checks an asset evaluates itself and reports with its output, by name, with their descriptions; those that
say "Blocking:" are."""


def reported_check(name: str, asset_key: dg.AssetKey) -> dg.AssetCheckSpec:
    """The spec of the check `name` (`REPORTED_CHECKS`) that `asset_key`'s asset reports."""
    description = REPORTED_CHECKS[name]
    return dg.AssetCheckSpec(
        name, asset=asset_key, blocking=description.startswith("Blocking:"), description=description
    )


def _error_unless_passed(
    name: str, asset_key: dg.AssetKey, failure: str | None, metadata: dict[str, float]
) -> dg.AssetCheckResult:
    """A reported check's result at ERROR severity: failed with `failure` (why), or passed where it is None."""
    return dg.AssetCheckResult(
        check_name=name,
        asset_key=asset_key,
        passed=failure is None,
        description=failure,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata=metadata,
    )


def eval_not_degenerate(asset_key: dg.AssetKey, health: OutputHealth, failure: str | None) -> dg.AssetCheckResult:
    """ERROR when an eval's greedy outputs are degenerate (`failure`: why; thresholds in EvalConfig)."""
    return _error_unless_passed(EVAL_NOT_DEGENERATE, asset_key, failure, health.as_dict())


def verifier_informative(asset_key: dg.AssetKey, failure: str | None, metrics: dict[str, float]) -> dg.AssetCheckResult:
    """ERROR when the verifier is not shown to tell right samples from wrong (`failure`: why, from
    `verifier.judged_auroc`)."""
    measured = {name: float(value) for name, value in metrics.items() if value is not None}
    return _error_unless_passed(VERIFIER_INFORMATIVE, asset_key, failure, measured)


def pseudo_label_quality(
    asset_key: dg.AssetKey,
    failure: str | None,
    coverage: float,
    mean_agreement: float,
    min_coverage: float,
    min_agreement: float,
) -> dg.AssetCheckResult:
    """ERROR when too few labels survive tau, or the teacher agrees with itself too rarely to trust them
    (`failure`: why, from `pseudo_labels.label_floor_failure`)."""
    floors = {
        "coverage": coverage,
        "min_coverage": min_coverage,
        "mean_agreement": mean_agreement,
        "min_agreement": min_agreement,
    }
    return _error_unless_passed(PSEUDO_LABEL_QUALITY, asset_key, failure, floors)


def no_eval_regression(
    asset_key: dg.AssetKey, accuracy: float, previous_accuracy: float | None, previous_name: str, tolerance: float
) -> dg.AssetCheckResult:
    """WARN when greedy accuracy fell by more than `tolerance` against the previous checkpoint."""
    passed = previous_accuracy is None or accuracy >= previous_accuracy - tolerance
    return dg.AssetCheckResult(
        check_name=NO_EVAL_REGRESSION,
        asset_key=asset_key,
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "greedy_accuracy": accuracy,
            "previous": previous_name,
            "previous_greedy_accuracy": previous_accuracy if previous_accuracy is not None else float("nan"),
            "tolerance": tolerance,
        },
    )


def checkpoint_checks(asset_key: dg.AssetKey) -> list[dg.AssetChecksDefinition]:
    """Blocking checks of an arm's published checkpoint `asset_key`: every weight is finite, and a short greedy
    generation on the first eval prompts yields text that does not all run to the token limit.

    The checkpoint's own asset already refuses to publish non-finite weights; `finite_weights` makes the
    verdict visible in the UI and catches a checkpoint changed or placed in the lake by other means.
    """
    asset = asset_key.to_user_string()

    def checkpoint_dir(context: dg.AssetCheckExecutionContext, data_lake: DataLake):
        path = data_lake.artifact_dir(asset_key, context.partition_key)
        if not (path / "config.json").exists():
            raise dg.Failure(f"{asset} arm {context.partition_key} has no checkpoint at {path}")
        return path

    @dg.asset_check(
        asset=asset_key,
        name=FINITE_WEIGHTS,
        blocking=True,
        partitions_def=ARMS,
        description="Blocking: every tensor of the published checkpoint is finite (no NaN, no inf).",
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
        partitions_def=ARMS,
        pool=DEVICE_POOL,
        additional_ins={"eval_problems": dg.AssetIn(EVAL_PROBLEMS)},
        description="Blocking: greedy completions of the first eval prompts are not empty and do not all run to the "
        "token limit.",
    )
    def smoke_generation(
        context: dg.AssetCheckExecutionContext,
        config: SmokeConfig,
        eval_problems: pl.DataFrame,
        data_lake: DataLake,
        compute: ComputeResource,
    ) -> dg.AssetCheckResult:
        from noisy_student_assets.core.evaluation import smoke_test

        directory = checkpoint_dir(context, data_lake)
        with compute.exclusive(context.log.info):
            completions, health, failure = smoke_test(directory, eval_problems, config.to_settings(), compute.settings)
        return dg.AssetCheckResult(
            passed=failure is None,
            severity=dg.AssetCheckSeverity.ERROR,
            description=failure,
            metadata=health.as_dict()
            | {
                "completions": markdown_table(
                    completions.select("problem_id", "finish_reason", "n_tokens", "completion"), max_rows=None
                )
            },
        )

    return [finite_weights, smoke_generation]


def compute_matched_check(control_key: dg.AssetKey, student_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    """ERROR when a control checkpoint's lineage spent other optimizer steps, prompts or completions than
    the round's student's, or when its own run trained another way (LoRA rank and alpha, learning rate, completion
    length limit, group size K, temperature: `RECIPE_FIELDS`): the round's gain over it would then not be a gain of
    the data alone at equal compute. The completion tokens each one generated are reported beside."""

    @dg.asset_check(
        asset=control_key,
        name=COMPUTE_MATCHED,
        partitions_def=ARMS,
        additional_deps=[student_key],
        blocking=True,  # a control eval at other compute would answer a different question than the verdict asks
        description="Blocking: since the base model, this control spent the same optimizer steps, prompts and "
        "completions as the round's student, and its run trained with the same recipe (LoRA, learning rate, "
        "completion length, K, temperature); compute.json of both checkpoints.",
    )
    def compute_matched(context: dg.AssetCheckExecutionContext, data_lake: DataLake) -> dg.AssetCheckResult:
        checkpoints = {
            name: data_lake.artifact_dir(key, context.partition_key)
            for name, key in (("control", control_key), ("student", student_key))
        }
        if not checkpoints["student"].exists():
            # a run that trains the controls alone (`grid run --through` a control's eval) has no student to match:
            # not judged, which does not stop the control's eval (WARN) and does not count as passed either
            return dg.AssetCheckResult(
                passed=False,
                severity=dg.AssetCheckSeverity.WARN,
                description="the round's student is not trained yet: nothing to match this control against; "
                "evaluate this check again once it is",
            )
        # read_compute takes a missing record for the base model's (none spent): a trained checkpoint without one
        # has an unknown spend, which matches nothing
        unrecorded = [name for name, path in checkpoints.items() if not (path / COMPUTE_FILE).exists()]
        if unrecorded:
            return dg.AssetCheckResult(
                passed=False,
                severity=dg.AssetCheckSeverity.ERROR,
                description=f"no recorded compute ({COMPUTE_FILE}) in the {' and the '.join(unrecorded)} checkpoint: "
                "what it spent is unknown, so the control cannot be shown to match the student",
            )
        control, student = read_compute(checkpoints["control"]), read_compute(checkpoints["student"])
        mismatches = control.total.mismatches(student.total) + recipe_mismatches(control.recipe, student.recipe)
        tokens = (
            "completion tokens generated since the base model: "
            f"control {control.total.generated_tokens}, student {student.total.generated_tokens}"
        )
        if not (control.recipe and student.recipe):
            tokens += f"; {UNRECORDED_RECIPE}"
        return dg.AssetCheckResult(
            passed=not mismatches,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"control vs student: {'; '.join(mismatches)} ({tokens})" if mismatches else tokens,
            metadata={f"control/{k}": v for k, v in control.total.as_dict().items()}
            | {f"student/{k}": v for k, v in student.total.as_dict().items()}
            | {
                "control/recipe": dg.MetadataValue.json(control.recipe),
                "student/recipe": dg.MetadataValue.json(student.recipe),
            },
        )

    return compute_matched
