"""Test-time (transductive) arms in the reports (no Dagster here).

A test-time arm pseudo-labels and trains on prompts of the held-out set itself, gold hidden (TTRL, Zuo et al.
2025), so its accuracy on the whole set mixes two questions. Every report on such an arm splits the per-problem
scores of each evaluation, which always covers the whole set, into:

- transductive: the eval problems the arm took as unlabeled (their prompts were sampled and trained on);
- transfer: the fixed other half of the held-out set (`problems.eval_halves`), which no arm trains on.

TTRL's own yardstick sits beside the verdict: on the transductive problems, the teacher's maj@K and pass@K
(from the round's K samples, against the hidden gold) and the student's greedy accuracy, which TTRL reports
rising toward the teacher's maj@K.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from noisy_student_assets.core.problems import eval_halves
from noisy_student_assets.core.reporting.verdict import Difference, paired_difference, paired_scores

if TYPE_CHECKING:
    from noisy_student_assets.core.pseudo_labels.labels import PublishedAudit

ALL_EVAL, TRANSDUCTIVE, TRANSFER = "all", "transductive", "transfer"
EVAL_SETS = (ALL_EVAL, TRANSDUCTIVE, TRANSFER)
"""What a difference is measured over: the whole held-out set, or (test-time arms) one of its two sets."""
YARDSTICK_TABLE = "TTRL yardstick on the transductive problems"


def eval_sets(eval_problems: pl.DataFrame, unlabeled_ids: pl.Series) -> pl.DataFrame:
    """`problem_id`, `eval_set` for every eval problem of a test-time arm's split into transductive and transfer
    problems; empty when none of `unlabeled_ids` is an eval problem (an arm that is not test-time)."""
    transductive = eval_problems.filter(pl.col("problem_id").is_in(unlabeled_ids.implode()))
    if transductive.is_empty():
        return pl.DataFrame(schema={"problem_id": pl.Utf8, "eval_set": pl.Utf8})
    transfer = eval_halves(eval_problems)[1].join(transductive, on="problem_id", how="anti")
    return pl.concat(
        [
            transductive.select("problem_id", pl.lit(TRANSDUCTIVE).alias("eval_set")),
            transfer.select("problem_id", pl.lit(TRANSFER).alias("eval_set")),
        ]
    )


def set_differences(
    pairs: list[tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame | None]],
    *,
    treatment_name: str,
    control_name: str,
    margin: float | None = None,
) -> dict[str, Difference]:
    """Treatment minus control, paired by problem over the seeds of `pairs` (per seed: the treatment's scores, the
    control's, and the arm's `eval_sets`, None or empty for an arm that is not test-time): over the whole held-out
    set, and over each of its two sets that every pair has (a held-out set of one problem has no transfer half);
    `margin`: the experiment's equivalence margin."""
    differences = {}
    for eval_set in EVAL_SETS:
        if eval_set != ALL_EVAL and not all(
            sets is not None and (sets["eval_set"] == eval_set).any() for *_, sets in pairs
        ):
            continue
        differences[eval_set] = paired_difference(
            *paired_scores(
                [
                    (treatment, control)
                    if eval_set == ALL_EVAL
                    else (scores_in(treatment, sets, eval_set), scores_in(control, sets, eval_set))
                    for treatment, control, sets in pairs
                ]
            ),
            treatment_name=treatment_name + ("" if eval_set == ALL_EVAL else f" on the {eval_set} problems"),
            control_name=control_name,
            margin=margin,
        )
    return differences


def scores_in(scores: pl.DataFrame, sets: pl.DataFrame, eval_set: str) -> pl.DataFrame:
    """The rows of an eval's `scores` whose problem is in `eval_set`."""
    return scores.join(sets.filter(pl.col("eval_set") == eval_set).select("problem_id"), on="problem_id", how="semi")


def yardstick(
    audit: PublishedAudit,
    teacher_scores: pl.DataFrame,
    student_scores: pl.DataFrame,
    control_scores: pl.DataFrame,
    sets: pl.DataFrame,
) -> pl.DataFrame:
    """One row: on the transductive problems, the teacher's greedy accuracy, maj@K and pass@K (the pseudo-label
    audit: the round's samples against the hidden gold) and mean sampled accuracy, the student's greedy accuracy
    and its labeled-only control's."""

    return pl.DataFrame(
        [
            {
                "problems": int((sets["eval_set"] == TRANSDUCTIVE).sum()),
                "teacher_greedy": greedy_accuracy_in(teacher_scores, sets, TRANSDUCTIVE),
                "teacher_maj_at_k": audit.teacher_maj_at_k,
                "teacher_pass_at_k": audit.teacher_pass_at_k,
                "teacher_sampled_pass_at_1": audit.teacher_pass_at_1,
                "student_greedy": greedy_accuracy_in(student_scores, sets, TRANSDUCTIVE),
                "labeled_only_greedy": greedy_accuracy_in(control_scores, sets, TRANSDUCTIVE),
            }
        ]
    )


def greedy_accuracy_in(scores: pl.DataFrame, sets: pl.DataFrame, eval_set: str) -> float:
    """An eval's greedy accuracy over the problems of `eval_set`."""
    return float(scores_in(scores, sets, eval_set)["greedy_correct"].cast(pl.Float64).mean())


FLIP_SCHEMA = pl.Schema(
    {
        "eval_set": pl.Utf8,
        "problems": pl.Int64,
        "right_to_wrong": pl.Int64,
        "wrong_to_right": pl.Int64,
        "difference": pl.Float64,
    }
)


def flips(before: pl.DataFrame, after: pl.DataFrame, sets: pl.DataFrame | None = None) -> pl.DataFrame:
    """How many problems went from right to wrong and from wrong to right between two evals' greedy answers (a
    teacher's and its student's), over the problems both scored, beside the accuracy difference they add up to: over
    the whole held-out set, and apart on each set of a test-time arm (`eval_sets`, None or empty otherwise)."""
    paired = (
        before.select("problem_id", pl.col("greedy_correct").alias("before"))
        .join(after.select("problem_id", pl.col("greedy_correct").alias("after")), on="problem_id")
        .drop_nulls()
    )
    labelled = paired.with_columns(pl.lit(ALL_EVAL).alias("eval_set"))
    if sets is not None and sets.height:
        labelled = pl.concat([labelled, paired.join(sets, on="problem_id")])
    return (
        labelled.group_by("eval_set", maintain_order=True)
        .agg(
            pl.len().cast(pl.Int64).alias("problems"),
            (pl.col("before") & ~pl.col("after")).sum().cast(pl.Int64).alias("right_to_wrong"),
            (~pl.col("before") & pl.col("after")).sum().cast(pl.Int64).alias("wrong_to_right"),
        )
        .with_columns(((pl.col("wrong_to_right") - pl.col("right_to_wrong")) / pl.col("problems")).alias("difference"))
        .match_to_schema(FLIP_SCHEMA)
    )
