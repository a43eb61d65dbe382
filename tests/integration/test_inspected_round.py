"""What the notebooks and the explorer show of a round (`core.reporting.inspection`) is what the round computed: the
re-weighed vote gives the published labels, the samples' grades give the published audit, and a checkpoint asked
on demand answers as its evaluation did."""

from __future__ import annotations

import shutil

import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.lake_reader import RoundLake, lake_rounds
from noisy_student_assets.core.pseudo_labels.sources.registry import SOURCES
from noisy_student_assets.core.reporting.inspection import (
    WEIGHT_PREFIX,
    absent_sources,
    greedy_answers,
    problem_record,
    sample_votes,
    side_by_side,
    source_labels,
    vote_summary,
)
from noisy_student_assets.core.sampling import load_transformers_model
from tests.conftest import INSPECTED_ARM
from tests.tiny_configs import TINY_EVAL


def test_the_inspected_round_is_the_published_one(inspected_lake) -> None:
    assert lake_rounds(inspected_lake).rows() == [(INSPECTED_ARM, 1)]
    round_lake = RoundLake(inspected_lake, INSPECTED_ARM, 1)
    published = round_lake.labels().table()

    votes = sample_votes(round_lake)
    assert votes.height == round_lake.generations().height
    assert [column for column in votes.columns if column.startswith(WEIGHT_PREFIX)] == [
        WEIGHT_PREFIX + name for name in SOURCES
    ]
    assert votes["correct"].mean() == round_lake.labels().audit.teacher_pass_at_1, (
        "the samples are graded as the audit graded them"
    )

    labels = source_labels(round_lake)
    assert set(labels["source"]) == set(SOURCES)
    chosen = labels.filter("chosen")
    assert set(chosen["source"]) == {round_lake.labels().settings.label_source}
    assert chosen.select("problem_id", "pseudo_label", "kept").equals(
        published.select("problem_id", "pseudo_label", "kept")
    )
    assert chosen.filter("kept")["label_correct"].mean() == round_lake.labels().audit.kept_label_accuracy

    problem_id = published["problem_id"][0]
    summary = vote_summary(votes, problem_id)
    assert summary["samples"].sum() == votes.filter(pl.col("problem_id") == problem_id).height
    for name in SOURCES:
        assert abs(summary[f"share/{name}"].sum() - 1.0) < 1e-9
    assert problem_record(round_lake, problem_id)["hidden_gold"]


def test_a_checkpoint_asked_on_demand_answers_as_its_evaluation_did(inspected_lake) -> None:
    round_lake = RoundLake(inspected_lake, INSPECTED_ARM, 1)
    table = side_by_side(round_lake)
    roles = (layout.STUDENT_ROLE, layout.LABELED_ONLY)
    assert [f"{role}/correct" for role in roles] == [column for column in table.columns if column.endswith("/correct")]
    evaluation = round_lake.evaluation(layout.STUDENT_ROLE)
    greedy, _ = evaluation.completions()
    eval_problems = pl.read_parquet(
        layout.artifact_dir(inspected_lake, layout.EVAL_PROBLEMS, INSPECTED_ARM) / layout.TABLE_FILE_NAME
    )
    first = greedy.join(eval_problems.select("problem_id", "prompt"), on="problem_id").row(0, named=True)
    (answer,) = greedy_answers(
        round_lake.checkpoint(layout.STUDENT_ROLE), [first["prompt"]], max_new_tokens=TINY_EVAL["max_new_tokens"]
    )
    assert answer["completion"] == first["completion"]
    # a model loaded once answers as one loaded for the question
    model = load_transformers_model(round_lake.checkpoint(layout.STUDENT_ROLE))
    (kept_loaded,) = greedy_answers(
        round_lake.checkpoint(layout.STUDENT_ROLE),
        [first["prompt"]],
        max_new_tokens=TINY_EVAL["max_new_tokens"],
        model=model,
    )
    assert kept_loaded == answer


def test_a_source_the_round_cannot_judge_is_said_absent_with_why(inspected_lake, tmp_path) -> None:
    """Every source judges the inspected round; without its verifier scores, the verifier is absent, and an arm
    whose own source reads no verifier is told so."""
    assert absent_sources(RoundLake(inspected_lake, INSPECTED_ARM, 1)) == {}
    root = tmp_path / "lake"
    shutil.copytree(inspected_lake, root, ignore=shutil.ignore_patterns("*.safetensors"))
    round_lake = RoundLake(root, INSPECTED_ARM, 1)
    shutil.rmtree(round_lake.arm_lake.artifact_dir(layout.round_asset(1, layout.VERIFIER_SCORES)))
    absent = absent_sources(round_lake)
    assert list(absent) == ["verifier"]
    own = round_lake.labels().settings.label_source
    assert absent["verifier"].startswith(f"this arm's label source, {own}, reads no verifier")
