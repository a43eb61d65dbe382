"""Pseudo-labels from a teacher's K samples: a vote weighed by a label source (`sources/`; the plain majority by
default), a confidence filter, and an audit against the hidden gold, with every source's label-quality frontier
(no Dagster here).

Noisy Student (Xie et al. 2020, "Self-training with Noisy Student improves ImageNet classification")
labels unlabeled data with the teacher and keeps confident labels; for LLM math the label is the
majority answer over K samples and the confidence is its agreement (self-consistency, Wang et al. 2023),
as in test-time RL (Zuo et al. 2025, "TTRL").

Answers the vote could not grade (``consensus``) are counted per problem (``ungraded``) and in the stats; an
audit check against the hidden gold that is ungraded is left out of the audit's shares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from noisy_student_assets.core.grading import answers_equivalent
from noisy_student_assets.core.layout import parse_sidecar, read_sidecar
from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN
from noisy_student_assets.core.pseudo_labels.consensus import weighted_vote
from noisy_student_assets.core.pseudo_labels.frontier import frontier
from noisy_student_assets.core.pseudo_labels.sources.registry import SOURCES
from noisy_student_assets.core.settings import PseudoLabelSettings

PSEUDO_LABEL_SCHEMA = pl.Schema(
    {
        "problem_id": pl.Utf8,
        "prompt": pl.Utf8,
        "pseudo_label": pl.Utf8,
        "count": pl.Int32,
        "k": pl.Int32,
        "agreement": pl.Float64,
        "n_clusters": pl.Int32,
        "entropy": pl.Float64,
        "ungraded": pl.Int32,
        "kept": pl.Boolean,
    }
)

AUDIT_FILE = "audit.json"
"""Beside the pseudo-labels table: tau and the audit's headline figures (`PublishedAudit`)."""
AUDIT_BUCKETS_FILE = "audit_by_agreement.json"
"""Beside the pseudo-labels table: `LabelAudit.buckets`."""
FRONTIER_FILE, SOURCES_FILE = "frontier.json", "label_sources.json"
"""Beside the pseudo-labels table: `PseudoLabels.frontier` and `PseudoLabels.sources`."""
SETTINGS_FILE = "settings.json"
"""Beside the pseudo-labels table: the `PseudoLabelSettings` the vote ran with (`lake_reader.RoundLabels.settings`)."""
VERIFIER_PREFIX = "verifier_"
"""In `AUDIT_FILE`, the verifier's measures beside the audit's figures: `verifier_validation_auroc`."""

AGREEMENT_BUCKETS = (0.0, 0.3, 0.5, 0.7, 0.9)
"""Lower edges of the agreement buckets of the audit: [0, 0.3), [0.3, 0.5), ..., [0.9, 1]."""


def vote_pseudo_labels(samples: pl.DataFrame, problems: pl.DataFrame, tau: float) -> pl.DataFrame:
    """One row per problem (in `problems` order): the answer its samples vote for and the vote's statistics; `kept`
    where a label exists and its agreement is at least `tau`.

    Reads only `problem_id`/`prompt` of `problems`, and `problem_id`/`sample_index`/`answer` of `samples`, with
    each sample's `weight` where there is one (a label source's, `sources`), else a head count.
    """
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau must be within [0, 1], got {tau}")
    weight = pl.col("weight") if "weight" in samples.columns else pl.lit(1.0)
    answers = (
        samples.select("problem_id", "sample_index", "answer", weight.cast(pl.Float64).alias("weight"))
        .sort("problem_id", "sample_index")
        .group_by("problem_id", maintain_order=True)
        .agg(pl.col("answer"), pl.col("weight"))
    )
    by_problem = {problem_id: (answers, weights) for problem_id, answers, weights in answers.iter_rows()}
    missing = [pid for pid in problems["problem_id"] if pid not in by_problem]
    if missing:
        raise ValueError(f"{len(missing)} problems have no generations (first: {missing[0]!r})")
    rows = []
    for problem_id, prompt in problems.select("problem_id", "prompt").iter_rows():
        vote = weighted_vote(*by_problem[problem_id])
        rows.append(
            {
                "problem_id": problem_id,
                "prompt": prompt,
                "pseudo_label": vote.answer,
                "count": vote.count,
                "k": vote.k,
                "agreement": vote.agreement,
                "n_clusters": vote.n_clusters,
                "entropy": vote.entropy,
                "ungraded": vote.ungraded,
                "kept": vote.answer is not None and vote.agreement >= tau,
            }
        )
    return pl.DataFrame(rows, schema=PSEUDO_LABEL_SCHEMA)


@dataclass(frozen=True)
class LabelAudit:
    """How good the pseudo-labels are, measured against the hidden gold (for reporting only)."""

    coverage: float
    """Share of unlabeled problems whose label was kept."""
    kept_label_accuracy: float | None
    """Share of kept labels equivalent to the hidden gold (None when nothing was kept)."""
    all_label_accuracy: float | None
    """The same over every problem that has a majority answer, kept or not."""
    teacher_pass_at_1: float
    """Share of all teacher samples whose answer matches the hidden gold."""
    teacher_maj_at_k: float
    """Share of problems whose majority answer matches the hidden gold (no answer counts as wrong): maj@K."""
    teacher_pass_at_k: float
    """Share of problems with at least one of the K samples matching the hidden gold: pass@K."""
    buckets: pl.DataFrame
    """Per agreement bucket: problems, labels correct, accuracy."""


def audit_pseudo_labels(
    pseudo_labels: pl.DataFrame, generations: pl.DataFrame, unlabeled_problems: pl.DataFrame
) -> LabelAudit:
    """Compare labels and samples with the unlabeled problems' hidden gold answers."""
    gold = dict(unlabeled_problems.select("problem_id", HIDDEN_GOLD_COLUMN).iter_rows())
    labels = with_label_correct(pseudo_labels, gold).with_columns(
        pl.col("agreement").cut(list(AGREEMENT_BUCKETS[1:]), left_closed=True, labels=_bucket_labels()).alias("bucket"),
    )
    samples = graded_samples(generations.select("problem_id", "answer"), unlabeled_problems)
    solved = set(samples.filter("correct")["problem_id"])
    labeled = labels.filter(pl.col("pseudo_label").is_not_null())
    kept = labels.filter("kept")
    buckets = (
        pl.DataFrame({"bucket": _bucket_labels()})
        .join(
            labeled.group_by("bucket")
            .agg(
                pl.len().alias("problems"),
                pl.col("label_correct").sum().alias("labels_correct"),
                pl.col("label_correct").mean().alias("label_accuracy"),  # over the graded labels
            )
            .with_columns(pl.col("bucket").cast(pl.Utf8)),
            on="bucket",
            how="left",
        )
        .with_columns(pl.col("problems", "labels_correct").fill_null(0).cast(pl.Int64))
    )
    return LabelAudit(
        coverage=kept.height / max(labels.height, 1),
        kept_label_accuracy=kept["label_correct"].mean() if kept.height else None,
        all_label_accuracy=labeled["label_correct"].mean() if labeled.height else None,
        teacher_pass_at_1=samples["correct"].mean() if samples.height else 0.0,
        teacher_maj_at_k=labels["label_correct"].mean() if labels.height else 0.0,
        teacher_pass_at_k=sum(pid in solved for pid in labels["problem_id"]) / max(labels.height, 1),
        buckets=buckets,
    )


def graded_samples(samples: pl.DataFrame, unlabeled_problems: pl.DataFrame) -> pl.DataFrame:
    """`samples` (the round's generations, or some of their columns) with `correct`: each answer's equivalence to its
    problem's hidden gold, as the audit grades it (null: ungraded)."""
    gold = dict(unlabeled_problems.select("problem_id", HIDDEN_GOLD_COLUMN).iter_rows())
    pairs = samples.select("problem_id", "answer").iter_rows()
    return samples.with_columns(
        pl.Series("correct", [answers_equivalent(gold[pid], answer) for pid, answer in pairs], dtype=pl.Boolean)
    )


def with_label_correct(labels: pl.DataFrame, gold: dict[str, str]) -> pl.DataFrame:
    """`labels` with `label_correct`: each label's equivalence to its problem's hidden gold (null: ungraded)."""
    return labels.with_columns(
        pl.struct("problem_id", "pseudo_label")
        .map_elements(
            lambda row: answers_equivalent(gold[row["problem_id"]], row["pseudo_label"]), return_dtype=pl.Boolean
        )
        .alias("label_correct")
    )


def _bucket_labels() -> list[str]:
    edges = [*AGREEMENT_BUCKETS, 1.0]
    return [f"[{low:.1f}, {high:.1f}{']' if high == 1.0 else ')'}" for low, high in pairwise(edges)]


def label_floor_failure(labels: pl.DataFrame, tau: float, min_coverage: float, min_mean_agreement: float) -> str | None:
    """Why these pseudo-labels must not train a student, or None when they clear both floors."""
    kept = int(labels["kept"].sum())
    coverage = kept / labels.height if labels.height else 0.0
    mean_agreement = labels["agreement"].mean() if labels.height else 0.0
    if kept == 0 and min_coverage > 0:
        return (
            f"tau={tau} keeps none of the {labels.height} pseudo-labels (highest agreement "
            f"{labels['agreement'].max() or 0.0:.2f}): lower tau, sample more answers (K), or set "
            "min_coverage=0 to train the student on the labeled problems only"
        )
    if coverage < min_coverage:
        return (
            f"tau={tau} keeps {kept}/{labels.height} pseudo-labels: "
            f"coverage {coverage:.3f} < min_coverage {min_coverage}"
        )
    if mean_agreement < min_mean_agreement:
        return f"mean agreement {mean_agreement:.3f} < min_mean_agreement {min_mean_agreement}"
    return None


class PublishedAudit(BaseModel):
    """The audit as published beside the pseudo-labels table (`AUDIT_FILE`): its figures against the hidden gold, the
    vote's tau and label source, and why the labels must not train a student. The student, the round's report, the
    run summary, the headroom table and the explorer read it through `read` or `from_files`. A figure that files
    published before it was measured lack reads as None."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    coverage: float
    kept: float
    mean_agreement: float
    kept_label_accuracy: float
    """NaN when nothing was kept."""
    all_label_accuracy: float
    """NaN when no problem has a label."""
    teacher_pass_at_1: float
    teacher_maj_at_k: float | None = None
    """None in files published before test-time arms (2026-11-25)."""
    teacher_pass_at_k: float | None = None
    """None in files published before test-time arms (2026-11-25)."""
    ungraded: float | None = None
    """Answers the grader could not judge; None in files published before ungraded answers were counted."""
    verifier: dict[str, float] = Field(default_factory=dict)
    """Where a verifier was trained for the round: its measures (`VERIFIER_PREFIX` + name in the file)."""
    tau: float
    label_source: str | None = None
    """None in files published before label sources (2026-11-26), whose vote was the head count."""
    floor_failure: str | None = None
    """Why the labels must not train a student (`label_floor_failure`); None when they clear the floors."""

    @classmethod
    def read(cls, labels_dir: Path) -> PublishedAudit:
        """The audit published in a pseudo-labels artifact directory."""
        return read_sidecar(cls, labels_dir / AUDIT_FILE)

    @classmethod
    def from_files(cls, files: Mapping[str, str], table: str) -> PublishedAudit:
        """The audit among the files published beside a pseudo-labels table (`table` names it in an error)."""
        return parse_sidecar(cls, files[AUDIT_FILE], f"{AUDIT_FILE} of {table}")

    @model_validator(mode="before")
    @classmethod
    def _gather_verifier_measures(cls, figures: Any) -> Any:
        """The file holds the verifier's measures flat among the audit's, as the asset's metadata shows them."""
        if not isinstance(figures, dict) or "verifier" in figures:
            return figures
        measures = {
            name.removeprefix(VERIFIER_PREFIX): value
            for name, value in figures.items()
            if name.startswith(VERIFIER_PREFIX)
        }
        rest = {name: value for name, value in figures.items() if not name.startswith(VERIFIER_PREFIX)}
        return rest | {"verifier": measures}

    @model_serializer(mode="wrap")
    def _flat(self, handler: Any) -> dict[str, Any]:
        """As the file holds it: the verifier's measures flat, in the place of `verifier`."""
        flat = {}
        for name, value in handler(self).items():
            if name == "verifier":
                flat |= {VERIFIER_PREFIX + measure: measured for measure, measured in value.items()}
            else:
                flat[name] = value
        return flat


@dataclass(frozen=True)
class PseudoLabels:
    """A round's vote, audited: the table, the headline figures, the audit by agreement, why the labels must not
    train a student (None when they clear the floors), and every label source's frontier from the same samples."""

    labels: pl.DataFrame
    stats: dict[str, float]
    buckets: pl.DataFrame
    floor_failure: str | None
    label_source: str
    frontier: pl.DataFrame
    """`frontier.CURVE_SCHEMA`: each source's label accuracy at each coverage, and the oracle's."""
    sources: pl.DataFrame
    """Per source: label accuracy at matched coverages, and its operating point (coverage and kept-label accuracy at
    tau)."""

    def sidecars(self, settings: PseudoLabelSettings, stats: dict[str, float] | None = None) -> dict[str, str]:
        """The small files published beside the table: the audit's figures (`stats`, default `self.stats`, with tau, the
        source and the floor failure, which the student reads before it trains), the vote's settings (what re-weighs
        its samples: `core.reporting.inspection`), the audit by agreement, and the frontier."""
        audit = PublishedAudit.model_validate(
            (self.stats if stats is None else stats)
            | {"tau": settings.tau, "label_source": self.label_source, "floor_failure": self.floor_failure}
        )
        return {
            AUDIT_FILE: audit.model_dump_json(),
            SETTINGS_FILE: settings.model_dump_json(),
            AUDIT_BUCKETS_FILE: self.buckets.write_json(),
            FRONTIER_FILE: self.frontier.write_json(),
            SOURCES_FILE: self.sources.write_json(),
        }


def source_votes(
    generations: pl.DataFrame,
    unlabeled: pl.DataFrame,
    settings: PseudoLabelSettings,
    verifier_scores: pl.DataFrame | None = None,
) -> dict[str, pl.DataFrame]:
    """The vote of the settings' label source and of every other source that can judge the same samples (the
    verifier's only where its scores are given), each kept at tau: source name -> `vote_pseudo_labels` table."""
    return {
        name: vote_pseudo_labels(source.weighted(generations, settings, verifier_scores), unlabeled, settings.tau)
        for name, source in SOURCES.items()
        if name == settings.label_source or source.missing_input(generations, verifier_scores) is None
    }


def pseudo_label(
    generations: pl.DataFrame,
    unlabeled: pl.DataFrame,
    settings: PseudoLabelSettings,
    verifier_scores: pl.DataFrame | None = None,
) -> PseudoLabels:
    """The pseudo-label stage: the vote over the teacher's samples, each weighed by the settings' label source, kept at
    tau, audited against the hidden gold (which shapes no label), and judged against the quality floors; and the vote
    of every other source that can judge the same samples, for the frontier."""
    votes = source_votes(generations, unlabeled, settings, verifier_scores)
    labels = votes[settings.label_source]
    audit = audit_pseudo_labels(labels, generations, unlabeled)
    stats = {
        "coverage": audit.coverage,
        "kept": float(labels["kept"].sum()),
        "mean_agreement": labels["agreement"].mean(),
        "kept_label_accuracy": audit.kept_label_accuracy if audit.kept_label_accuracy is not None else float("nan"),
        "all_label_accuracy": audit.all_label_accuracy if audit.all_label_accuracy is not None else float("nan"),
        "teacher_pass_at_1": audit.teacher_pass_at_1,
        "teacher_maj_at_k": audit.teacher_maj_at_k,
        "teacher_pass_at_k": audit.teacher_pass_at_k,
        "ungraded": float(labels["ungraded"].sum()),
    }
    failure = label_floor_failure(labels, settings.tau, settings.min_coverage, settings.min_mean_agreement)
    gold = dict(unlabeled.select("problem_id", HIDDEN_GOLD_COLUMN).iter_rows())
    audited = {name: with_label_correct(vote, gold) for name, vote in votes.items()}
    curve, matched = frontier(audited, audit.teacher_pass_at_k)
    operating = pl.DataFrame(
        [
            {
                "source": name,
                "at tau: coverage": vote["kept"].mean() if vote.height else 0.0,
                "at tau: label_accuracy": vote.filter("kept")["label_correct"].mean(),
            }
            for name, vote in audited.items()
        ],
        schema={"source": pl.Utf8, "at tau: coverage": pl.Float64, "at tau: label_accuracy": pl.Float64},
    )
    return PseudoLabels(
        labels=labels,
        stats=stats,
        buckets=audit.buckets,
        floor_failure=failure,
        label_source=settings.label_source,
        frontier=curve,
        # Every source, the ones that kept no label too, then the oracle.
        sources=operating.join(matched, on="source", how="full", coalesce=True, maintain_order="left_right"),
    )
