"""What a round's eval report adds to the student's evaluation (no Dagster here): the verdict against the
labeled-only control, the arm's accuracy round by round, the flips from its teacher, how well the round's
pseudo-labels matched the hidden gold (by agreement, and every label source's frontier beside the oracle); on a
test-time arm, the same on its transductive and transfer problems apart, and TTRL's yardstick."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.lake_reader import RoundLabels
from noisy_student_assets.core.promotion import Promotion, taught_sentence
from noisy_student_assets.core.pseudo_labels.frontier import ORACLE
from noisy_student_assets.core.pseudo_labels.labels import PublishedAudit
from noisy_student_assets.core.reporting import plots, test_time
from noisy_student_assets.core.reporting.eval_report import PublishedEval, ReportExtras
from noisy_student_assets.core.reporting.verdict import Difference
from noisy_student_assets.core.training.compute import compute_comparison

ACCURACY_TABLE = "Accuracy per round and chain"
"""A table of each round's eval report: greedy accuracy of the arm's checkpoints up to that round (the next
round's report extends it)."""
FLIPS_TABLE = "Flips from the teacher"
SOURCES_TABLE = "Label sources at matched coverage"


@dataclass(frozen=True)
class RoundEvidence:
    """What a round's report compares its student with: the round's pseudo-labels (their table and the files
    published beside it), the labeled-only control's eval, the teacher's (the previous round's, or labeled RL's), the
    earlier evals (`previous_round`, `labeled_rl`, `base_model`; None: not materialized) and the held-out problems."""

    number: int
    arm: str
    labels: pl.DataFrame
    published: RoundLabels
    """What was published beside the labels' table: the audit, its buckets, each label source's frontier."""
    control: PublishedEval
    teacher: PublishedEval
    baselines: dict[str, PublishedEval | None]
    eval_problems: pl.DataFrame
    promotion: Promotion | None = None
    """The decision that made the round's teacher; None where labeled RL teaches (round 1)."""


def round_report(evidence: RoundEvidence, metrics: dict[str, float], scores: pl.DataFrame) -> ReportExtras:
    """The round's report extras, once the student's metrics and per-problem scores are known."""
    number, control, labels = evidence.number, evidence.control, evidence.labels
    sets = test_time.eval_sets(evidence.eval_problems, labels["problem_id"])
    by_set = test_time.set_differences(
        [(scores, control.scores, sets)],
        treatment_name=f"{layout.round_prefix(number)} (arm {evidence.arm})",
        control_name="its labeled-only control",
    )
    difference = by_set[test_time.ALL_EVAL]
    matched, compute_table = compute_comparison(metrics, control.metrics)
    flips = test_time.flips(evidence.teacher.scores, scores, sets)
    flipped = flips.row(0, named=True)
    lead = f"**Verdict.** {difference.sentence()} " + (
        "Both spent the same optimizer steps, prompts and completions since the base model."
        if matched
        else "**Not compute-matched**: see the compute table; the difference is not a gain at equal compute."
    )
    lead += (
        f"\n\n**Teacher.** {taught_sentence(evidence.promotion, number)}"
        f"\n\n**Flips from the teacher.** {flipped['wrong_to_right']} problems went from wrong to right and "
        f"{flipped['right_to_wrong']} from right to wrong, of {flipped['problems']} "
        f"({flipped['difference']:+.3f} greedy accuracy)."
    )
    audit, buckets = evidence.published.audit, evidence.published.buckets
    extra_metrics = {
        "flips/right_to_wrong": float(flipped["right_to_wrong"]),
        "flips/wrong_to_right": float(flipped["wrong_to_right"]),
    }
    extra_tables: dict[str, pl.DataFrame] = {}
    if sets.height:
        text, test_time_metrics, extra_tables = _test_time_arm(evidence, by_set, scores, sets, audit)
        lead += text
        extra_metrics |= test_time_metrics
    accuracy = accuracy_by_round(number, evidence.baselines, metrics, control.metrics)
    figures = {
        "accuracy_by_round": plots.accuracy_by_round(accuracy),
        "agreement_histogram": plots.agreement_histogram(
            labels["agreement"].to_list(), audit.tau, int(labels["k"].max())
        ),
        "label_accuracy_vs_agreement": plots.label_accuracy_vs_agreement(buckets),
    }
    tables = {
        ACCURACY_TABLE: accuracy,
        FLIPS_TABLE: flips,
        "Compute since the base model": compute_table,
        "Pseudo-label calibration": buckets,  # label accuracy against the hidden gold by agreement
        "Pseudo-label audit": pl.DataFrame([audit.model_dump(exclude={"floor_failure"})]),
    }
    curve, sources = evidence.published.frontier, evidence.published.sources
    if sources is not None:  # labels published before label sources have none
        figures["label_frontier"] = plots.label_frontier(curve, sources, ORACLE)
        tables[SOURCES_TABLE] = sources
        extra_metrics |= {
            f"labels/{row['source']}/{name.removeprefix('at tau: ')}_at_tau": value
            for row in sources.iter_rows(named=True)
            for name, value in row.items()
            if name.startswith("at tau: ") and value is not None
        }
    return ReportExtras(
        metrics={
            "verdict/difference": difference.estimate,
            "verdict/ci_low": difference.low,
            "verdict/ci_high": difference.high,
            "verdict/compute_matched": float(matched),
            **extra_metrics,
        },
        figures=figures,
        tables=tables | extra_tables,
        text=lead,
    )


def _test_time_arm(
    evidence: RoundEvidence,
    by_set: dict[str, Difference],
    scores: pl.DataFrame,
    sets: pl.DataFrame,
    audit: PublishedAudit,
) -> tuple[str, dict[str, float], dict[str, pl.DataFrame]]:
    """A test-time arm's part of the report (its eval problems include its unlabeled ones): the text on the
    transductive and transfer halves, their metrics, and the yardstick table."""
    counts = dict(sets["eval_set"].value_counts().iter_rows())
    text = (
        f"\n\n**Test-time arm.** {counts[test_time.TRANSDUCTIVE]} of the {evidence.eval_problems.height} eval "
        "problems are this arm's unlabeled problems: the **transductive** set, whose prompts the teacher sampled "
        "and the student trained on (their gold stayed hidden). "
        f"The other half's {counts.get(test_time.TRANSFER, 0)} problems, on which no arm trains, measure "
        "**transfer**. The verdict above is over the whole set, both halves together."
    )
    metrics: dict[str, float] = {}
    for eval_set, own in by_set.items():
        if eval_set == test_time.ALL_EVAL:
            continue
        text += f"\n\n- {eval_set.capitalize()}: {own.sentence()}"
        metrics |= {
            f"{eval_set}/greedy_accuracy": test_time.greedy_accuracy_in(scores, sets, eval_set),
            f"verdict/{eval_set}/difference": own.estimate,
            f"verdict/{eval_set}/ci_low": own.low,
            f"verdict/{eval_set}/ci_high": own.high,
        }
    yardstick = test_time.yardstick(audit, evidence.teacher.scores, scores, evidence.control.scores, sets)
    metrics |= {
        f"ttrl/{name}": float(value) for name, value in yardstick.row(0, named=True).items() if name != "problems"
    }
    return text, metrics, {test_time.YARDSTICK_TABLE: yardstick}


def accuracy_by_round(
    number: int,
    baselines: dict[str, PublishedEval | None],
    metrics: dict[str, float],
    control_metrics: dict[str, float],
) -> pl.DataFrame:
    """Greedy accuracy of the arm's student and labeled-only chains up to round `number`: round 0 is labeled RL
    (both chains start there), with the base model beside it."""
    schema = {"round": pl.Int64, "checkpoint": pl.Utf8, "greedy_accuracy": pl.Float64}
    if number > 1:
        table = baselines["previous_round"].table(ACCURACY_TABLE)
    else:
        base, labeled_rl = baselines["base_model"], baselines["labeled_rl"]
        table = pl.DataFrame(
            [
                {
                    "round": 0,
                    "checkpoint": layout.BASE_MODEL,
                    "greedy_accuracy": base.metrics["greedy_accuracy"] if base else None,
                },
                {
                    "round": 0,
                    "checkpoint": layout.STUDENT_ROLE,
                    "greedy_accuracy": labeled_rl.metrics["greedy_accuracy"],
                },
                {
                    "round": 0,
                    "checkpoint": layout.LABELED_ONLY,
                    "greedy_accuracy": labeled_rl.metrics["greedy_accuracy"],
                },
            ],
            schema=schema,
        )
    return pl.concat(
        [
            table,
            pl.DataFrame(
                [
                    {"round": number, "checkpoint": layout.STUDENT_ROLE, "greedy_accuracy": metrics["greedy_accuracy"]},
                    {
                        "round": number,
                        "checkpoint": layout.LABELED_ONLY,
                        "greedy_accuracy": control_metrics["greedy_accuracy"],
                    },
                ],
                schema=schema,
            ),
        ]
    )
