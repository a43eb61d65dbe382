"""Pseudo-labels from samples, their audit against the hidden gold, and the files published beside them."""

import json
import math
import re
from pathlib import Path

import polars as pl
import pytest

from noisy_student_assets.core.lake_reader import RoundLabels
from noisy_student_assets.core.pseudo_labels.labels import (
    AUDIT_FILE,
    PSEUDO_LABEL_SCHEMA,
    SETTINGS_FILE,
    PublishedAudit,
    audit_pseudo_labels,
    label_floor_failure,
    pseudo_label,
    vote_pseudo_labels,
)
from noisy_student_assets.core.settings import PseudoLabelSettings

REPOSITORY = Path(__file__).resolve().parents[2]

PROBLEMS = pl.DataFrame(
    {"problem_id": ["a", "b", "c"], "prompt": ["pa", "pb", "pc"], "hidden_gold_answer": ["0.5", "4", "7"]}
)
GENERATIONS = pl.DataFrame(
    {
        "problem_id": ["a"] * 5 + ["b"] * 5 + ["c"] * 5,
        "sample_index": [4, 3, 2, 1, 0] * 3,  # out of order on purpose: votes follow sample_index
        "answer": [None, "2", "\\frac{1}{2}", "0.5", "1/2", "4", "3", "3", "3", "3", None, None, None, None, None],
    }
)


def test_votes_use_equivalence_and_tau_decides_what_is_kept() -> None:
    labels = vote_pseudo_labels(GENERATIONS, PROBLEMS, tau=0.7)
    assert labels.schema == PSEUDO_LABEL_SCHEMA and labels["problem_id"].to_list() == ["a", "b", "c"]
    a, b, c = labels.iter_rows(named=True)
    assert (a["pseudo_label"], a["count"], a["agreement"], a["kept"]) == ("1/2", 3, 0.6, False)
    assert (b["pseudo_label"], b["count"], b["agreement"], b["kept"]) == ("3", 4, 0.8, True)
    assert (c["pseudo_label"], c["count"], c["kept"]) == (None, 0, False)
    assert vote_pseudo_labels(GENERATIONS, PROBLEMS, tau=0.6)["kept"].to_list() == [True, True, False]


def test_hidden_gold_does_not_change_the_labels() -> None:
    poisoned = PROBLEMS.with_columns(pl.lit("999").alias("hidden_gold_answer"))
    assert vote_pseudo_labels(GENERATIONS, poisoned, 0.5).equals(vote_pseudo_labels(GENERATIONS, PROBLEMS, 0.5))


def test_problems_without_samples_are_an_error() -> None:
    extra = pl.concat([PROBLEMS, pl.DataFrame({"problem_id": ["d"], "prompt": ["pd"], "hidden_gold_answer": ["1"]})])
    with pytest.raises(ValueError, match=r"1 problems have no generations.*'d'"):
        vote_pseudo_labels(GENERATIONS, extra, 0.5)


def test_tau_out_of_range() -> None:
    with pytest.raises(ValueError, match="tau"):
        vote_pseudo_labels(GENERATIONS, PROBLEMS, 1.5)


def test_audit_against_hidden_gold() -> None:
    labels = vote_pseudo_labels(GENERATIONS, PROBLEMS, tau=0.6)
    audit = audit_pseudo_labels(labels, GENERATIONS, PROBLEMS)
    assert audit.coverage == pytest.approx(2 / 3)
    assert audit.kept_label_accuracy == 0.5  # "1/2" right, "3" wrong
    assert audit.all_label_accuracy == 0.5
    assert audit.teacher_pass_at_1 == pytest.approx(4 / 15)  # three forms of 1/2 and one "4"
    assert audit.teacher_maj_at_k == pytest.approx(1 / 3)  # over every problem: c's missing label counts as wrong
    assert audit.teacher_pass_at_k == pytest.approx(2 / 3)  # b's majority is wrong, but one of its samples is right
    buckets = {row["bucket"]: row for row in audit.buckets.iter_rows(named=True)}
    assert buckets["[0.5, 0.7)"]["problems"] == 1 and buckets["[0.5, 0.7)"]["label_accuracy"] == 1.0
    assert buckets["[0.7, 0.9)"]["problems"] == 1 and buckets["[0.7, 0.9)"]["label_accuracy"] == 0.0
    assert buckets["[0.9, 1.0]"]["problems"] == 0 and buckets["[0.9, 1.0]"]["label_accuracy"] is None
    assert sum(audit.buckets["problems"]) == 2 and not math.isnan(audit.coverage)


def test_floor_failures_name_their_cause() -> None:
    labels = vote_pseudo_labels(GENERATIONS, PROBLEMS, 0.5)
    assert label_floor_failure(labels, 0.5, 0.05, 0.0) is None
    nothing_kept = labels.with_columns(kept=pl.lit(False))
    assert label_floor_failure(nothing_kept, 1.0, 0.05, 0.0).startswith(
        "tau=1.0 keeps none of the 3 pseudo-labels (highest agreement"
    )
    assert label_floor_failure(nothing_kept, 1.0, 0.0, 0.0) is None  # min_coverage=0: the labeled problems alone
    one_kept = labels.with_columns(kept=pl.Series([True, False, False]))
    assert (
        label_floor_failure(one_kept, 0.9, 0.5, 0.0)
        == "tau=0.9 keeps 1/3 pseudo-labels: coverage 0.333 < min_coverage 0.5"
    )
    assert label_floor_failure(labels, 0.5, 0.0, 0.99).startswith("mean agreement ")


def test_the_default_agreement_floor_fails_a_teacher_whose_answers_are_scattered() -> None:
    """At its default the floor can fail: K = 8 samples with 8 different answers on every problem (agreement 1/8)."""
    floor = PseudoLabelSettings().min_mean_agreement
    scattered = pl.DataFrame({"problem_id": ["a", "b"], "agreement": [0.125, 0.125], "kept": [True, True]})
    assert label_floor_failure(scattered, 0.0, 0.05, floor) == f"mean agreement 0.125 < min_mean_agreement {floor}"
    agreeing = scattered.with_columns(agreement=pl.lit(0.357))  # the mean agreement of `make run`'s round-1 teacher
    assert label_floor_failure(agreeing, 0.0, 0.05, floor) is None


FIRST_AUDIT = (
    '{"coverage": 0.25, "kept": 4.0, "mean_agreement": 0.4, "kept_label_accuracy": NaN, "all_label_accuracy": 0.5, '
    '"teacher_pass_at_1": 0.3, "tau": 0.5}'
)
"""An audit as the first rounds published it (2026-11-22): no floor, maj@K, pass@K, label source or ungraded count."""


def test_the_audit_and_the_settings_read_back_as_the_stage_wrote_them(tmp_path: Path) -> None:
    settings = PseudoLabelSettings(tau=0.6)
    voted = pseudo_label(GENERATIONS, PROBLEMS, settings)
    for name, text in voted.sidecars(settings, voted.stats | {"verifier_validation_auroc": 0.75}).items():
        (tmp_path / name).write_text(text)
    audit = PublishedAudit.read(tmp_path)
    assert (audit.tau, audit.label_source, audit.floor_failure) == (0.6, "majority", voted.floor_failure)
    assert {name: getattr(audit, name) for name in voted.stats} == voted.stats
    assert audit.verifier == {"validation_auroc": 0.75}, "the verifier's measures, flat in the file, read as its own"
    assert json.loads((tmp_path / AUDIT_FILE).read_text())["verifier_validation_auroc"] == 0.75
    assert RoundLabels.read(tmp_path, "round 1's labels").settings == settings


def test_an_audit_published_before_the_newer_figures_reads_with_them_as_none() -> None:
    audit = PublishedAudit.from_files({AUDIT_FILE: FIRST_AUDIT}, "an old round")
    assert math.isnan(audit.kept_label_accuracy) and audit.tau == 0.5
    assert (audit.teacher_maj_at_k, audit.label_source, audit.floor_failure, audit.verifier) == (None, None, None, {})


def test_every_audit_committed_in_results_reads_as_it_was_written() -> None:
    paths = sorted((REPOSITORY / "results").glob("**/audit.json"))
    assert paths, "results/ holds the headroom runs' audits"
    for path in paths:
        read = PublishedAudit.read(path.parent).model_dump()
        assert json.dumps(read, sort_keys=True) == json.dumps(json.loads(path.read_text()), sort_keys=True), path


def _renamed(figures: dict, old: str, new: str) -> dict:
    return {new if name == old else name: value for name, value in figures.items()}


@pytest.mark.parametrize(
    ("written", "named"),
    [
        (_renamed(json.loads(FIRST_AUDIT), "tau", "threshold"), "tau"),  # a required key renamed: missing
        (json.loads(FIRST_AUDIT) | {"maj_at_k": 0.5}, "maj_at_k"),  # an optional one renamed: a key no field names
        (json.loads(FIRST_AUDIT) | {"coverage": "most"}, "coverage"),
    ],
)
def test_an_audit_whose_keys_changed_is_refused_where_it_is_read_naming_its_file(
    tmp_path: Path, written: dict, named: str
) -> None:
    (tmp_path / AUDIT_FILE).write_text(json.dumps(written))
    with pytest.raises(
        ValueError, match=rf"(?s){re.escape(str(tmp_path / AUDIT_FILE))} is not a PublishedAudit.*{named}"
    ):
        PublishedAudit.read(tmp_path)


def test_settings_with_a_renamed_key_are_refused_naming_their_file(tmp_path: Path) -> None:
    (tmp_path / AUDIT_FILE).write_text(FIRST_AUDIT)
    (tmp_path / SETTINGS_FILE).write_text(json.dumps({"threshold": 0.5}))
    labels = RoundLabels.read(tmp_path, "round 1's labels")
    refused = rf"(?s){SETTINGS_FILE} of round 1's labels is not a PseudoLabelSettings.*threshold"
    with pytest.raises(ValueError, match=refused):
        _ = labels.settings
