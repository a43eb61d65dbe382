"""Asset checks, evaluated by the assets that own the data (so a failing floor can stop a round before
training on garbage) and reported to Dagster as check results."""

import dagster as dg

PSEUDO_LABEL_QUALITY = dg.AssetCheckSpec(
    "pseudo_label_quality",
    asset="pseudo_labels",
    description="Coverage at tau and mean agreement are above their configured floors.",
)
NO_EVAL_REGRESSION = dg.AssetCheckSpec(
    "no_eval_regression",
    asset="eval_report",
    description="Greedy accuracy did not drop more than the tolerance below the previous round (or labeled RL).",
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
