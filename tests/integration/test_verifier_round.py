"""A round whose vote a learned verifier weighs, materialized in process (the tiny model rewired to say "7"): the
verifier trains on the teacher's right and wrong samples of the labeled problems, passes its check, scores every
sample of the round, and the vote reads the scores; every source's frontier is published beside the labels. The
unlabeled problems' hidden gold reaches none of it."""

from __future__ import annotations

import dagster as dg
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.checkpoints import weights_sha256
from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN
from noisy_student_assets.core.pseudo_labels.frontier import ORACLE
from noisy_student_assets.core.pseudo_labels.labels import FRONTIER_FILE, SOURCES_FILE, PublishedAudit
from noisy_student_assets.core.training.verifier import TRAINING_PAIRS_FILE, PublishedVerifier
from noisy_student_assets.defs.checks import VERIFIER_INFORMATIVE
from resources.data_lake import DataLake
from tests.lakes import answerable_by_sevens, arms_instance, materialize
from tests.tiny_configs import op, round_names, tiny_config, with_op_config

ARM = "a"
POISON = "987654321"
SPLIT = [layout.UNLABELED_PROBLEMS, layout.VALIDATION_PROBLEMS]
ROUND_1 = round_names(1, layout.GENERATIONS, layout.VERIFIER, layout.VERIFIER_SCORES, layout.PSEUDO_LABELS)


def _verifier_config(model_dir) -> dict:
    return with_op_config(
        tiny_config(model_dir, tau=0.5), op(layout.round_prefix(1), layout.PSEUDO_LABELS), label_source="verifier"
    )


def test_a_verifier_weighs_the_vote_of_its_round(sevens_lake_copy, sevens_model_dir) -> None:
    lake = sevens_lake_copy()
    with arms_instance() as instance:
        materialize(lake, SPLIT, _verifier_config(sevens_model_dir), ARM, instance=instance)
        answerable_by_sevens(lake, ARM)
        result = materialize(lake, ROUND_1, _verifier_config(sevens_model_dir), ARM, instance=instance)
    (check,) = [
        evaluation
        for evaluation in result.get_asset_check_evaluations()
        if evaluation.check_name == VERIFIER_INFORMATIVE
    ]
    assert check.passed, check.description

    key = lambda name: dg.AssetKey(layout.round_asset(1, name))  # noqa: E731
    verifier = lake.artifact_dir(key(layout.VERIFIER), ARM)
    metrics = PublishedVerifier.read(verifier).metrics
    assert metrics.pairs > 0 and metrics.validation_auroc is not None
    assert 0.0 <= metrics.validation_pass_at_k <= 1.0 and metrics.validation_maj_at_k <= metrics.validation_pass_at_k
    assert not any(verifier.glob("adapter_*")), "the verifier is saved merged"

    generations = lake.read_table(key(layout.GENERATIONS), ARM)
    scores = lake.read_table(key(layout.VERIFIER_SCORES), ARM)
    assert (
        scores.select("problem_id", "sample_index")
        .sort("problem_id", "sample_index")
        .equals(generations.select("problem_id", "sample_index").sort("problem_id", "sample_index"))
    )
    assert scores["score"].is_finite().all() and scores["score"].n_unique() > 1

    labels_dir = lake.artifact_dir(key(layout.PSEUDO_LABELS), ARM)
    audit = PublishedAudit.read(labels_dir)
    assert audit.label_source == "verifier" and audit.verifier["validation_auroc"] == metrics.validation_auroc
    frontier = pl.read_json(labels_dir / FRONTIER_FILE)
    assert set(frontier["source"]) == {"majority", "confidence", "verifier", ORACLE}
    assert set(pl.read_json(labels_dir / SOURCES_FILE)["source"]) == {"majority", "confidence", "verifier", ORACLE}


def test_poisoned_hidden_gold_changes_no_verifier_pair_score_or_label(sevens_lake_copy, sevens_model_dir) -> None:
    lakes = {"clean": sevens_lake_copy(), "poisoned": sevens_lake_copy()}
    config = _verifier_config(sevens_model_dir)
    unlabeled_key = dg.AssetKey(layout.UNLABELED_PROBLEMS)
    for name, lake in lakes.items():
        materialize(lake, SPLIT, config, ARM)
        # The clean gold is what the teacher says, so that a leak that filtered labels by the gold would keep them
        # on the clean lake and drop them on the poisoned one.
        gold = "7" if name == "clean" else POISON
        lake.write_table(
            lake.read_table(unlabeled_key, ARM).with_columns(pl.lit(gold).alias(HIDDEN_GOLD_COLUMN)), unlabeled_key, ARM
        )
        answerable_by_sevens(lake, ARM)
        materialize(lake, ROUND_1, config, ARM)

    def artifact(lake: DataLake, name: str):
        return lake.artifact_dir(dg.AssetKey(layout.round_asset(1, name)), ARM)

    clean, poisoned = lakes["clean"], lakes["poisoned"]
    assert pl.read_parquet(artifact(clean, layout.VERIFIER) / TRAINING_PAIRS_FILE).equals(
        pl.read_parquet(artifact(poisoned, layout.VERIFIER) / TRAINING_PAIRS_FILE)
    )
    assert weights_sha256(artifact(clean, layout.VERIFIER)) == weights_sha256(artifact(poisoned, layout.VERIFIER))
    for name in (layout.VERIFIER_SCORES, layout.PSEUDO_LABELS):
        table = dg.AssetKey(layout.round_asset(1, name))
        assert clean.read_table(table, ARM).equals(poisoned.read_table(table, ARM)), name
    audits = {name: PublishedAudit.read(artifact(lake, layout.PSEUDO_LABELS)) for name, lake in lakes.items()}
    assert audits["clean"].kept_label_accuracy > 0 and audits["poisoned"].kept_label_accuracy == 0, (
        "the audit alone reads the gold"
    )
    assert POISON not in repr(poisoned.read_table(dg.AssetKey(layout.round_asset(1, layout.PSEUDO_LABELS)), ARM).rows())
