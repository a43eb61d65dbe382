"""The label-quality frontier (no Dagster here): for each label source, the accuracy of the labels it keeps against
the hidden gold at each coverage (the share of unlabeled problems kept), the most confident labels first, beside the
oracle ceiling (pass@K: a label is right wherever any of the K samples is right). For reporting only: the gold
reaches this after every label is made, and no source's operating point (its tau) is chosen here.

Problems whose votes tie in agreement cannot be told apart by the source, so within a tie the curve takes the
expected share of right labels (as if the tie were broken at random), not an order the gold could favour.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import polars as pl

ORACLE = "oracle (pass@K)"
"""The frontier's ceiling: a label is right wherever any sample is right, and those problems are kept first."""
MATCHED_COVERAGES = (0.1, 0.25, 0.5, 0.75, 1.0)
"""The coverages at which sources are compared side by side."""
CURVE_SCHEMA = pl.Schema({"source": pl.Utf8, "kept": pl.Int64, "coverage": pl.Float64, "label_accuracy": pl.Float64})


def source_curve(source: str, labels: pl.DataFrame) -> pl.DataFrame:
    """`source`'s frontier (`CURVE_SCHEMA`) from its votes (`labels.vote_pseudo_labels` with `label_correct`, the
    label's equivalence to the hidden gold: null, where the check was ungraded, counts as not right)."""
    total = labels.height
    voted = labels.filter(pl.col("pseudo_label").is_not_null())
    ties = (
        voted.group_by("agreement")
        .agg(pl.len().alias("problems"), pl.col("label_correct").fill_null(False).sum().alias("right"))
        .sort("agreement", descending=True)
    )
    rows, kept_before, right_before = [], 0, 0.0
    for problems, right in ties.select("problems", "right").iter_rows():
        for within in range(1, problems + 1):
            kept = kept_before + within
            rows.append(
                {
                    "source": source,
                    "kept": kept,
                    "coverage": kept / total,
                    "label_accuracy": (right_before + within * right / problems) / kept,
                }
            )
        kept_before, right_before = kept_before + problems, right_before + right
    return pl.DataFrame(rows, schema=CURVE_SCHEMA)


def oracle_curve(problems: int, solved: int) -> pl.DataFrame:
    """The ceiling over `problems` of which `solved` have a right sample among their K."""
    rows = [
        {"source": ORACLE, "kept": kept, "coverage": kept / problems, "label_accuracy": min(1.0, solved / kept)}
        for kept in range(1, problems + 1)
    ]
    return pl.DataFrame(rows, schema=CURVE_SCHEMA)


def coverage_column(coverage: float) -> str:
    """The name of the matched-coverage column of `coverage`: 'at 50%'."""
    return f"at {coverage:.0%}"


def kept_at(coverage: float, problems: int) -> int:
    """How many labels a source keeps at `coverage` of `problems` (at least one)."""
    return max(1, math.ceil(coverage * problems - 1e-9))


def at_coverages(curve: pl.DataFrame, problems: int, coverages: Sequence[float] = MATCHED_COVERAGES) -> pl.DataFrame:
    """Each source's label accuracy at the same coverages (null where it keeps fewer labels): the sources compared
    at matched coverage, one row per source."""
    rows = []
    for source in curve["source"].unique(maintain_order=True):
        accuracy = dict(curve.filter(pl.col("source") == source).select("kept", "label_accuracy").iter_rows())
        rows.append(
            {"source": source}
            | {coverage_column(coverage): accuracy.get(kept_at(coverage, problems)) for coverage in coverages}
        )
    return pl.DataFrame(
        rows, schema={"source": pl.Utf8} | {coverage_column(coverage): pl.Float64 for coverage in coverages}
    )


def frontier(labelled: Mapping[str, pl.DataFrame], pass_at_k: float) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The curves of every source in `labelled` (source -> its votes with `label_correct`) and of the oracle, and
    the sources at matched coverage. `pass_at_k`: the share of problems with a right sample."""
    problems = next(iter(labelled.values())).height
    curve = pl.concat(
        [
            *(source_curve(source, labels) for source, labels in labelled.items()),
            oracle_curve(problems, round(pass_at_k * problems)),
        ]
    )
    return curve, at_coverages(curve, problems)
