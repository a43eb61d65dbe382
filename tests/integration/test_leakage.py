"""The hidden gold of unlabeled problems reaches the audit and nothing else: a round on a lake whose hidden
gold is poisoned samples, labels, rewards and trains exactly as the round on the clean lake."""

from __future__ import annotations

import functools
import shutil

import dagster as dg
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.checkpoints import weights_sha256
from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN
from noisy_student_assets.core.training import grpo as training
from tests.lakes import materialize
from tests.tiny_configs import round_names, tiny_config

POISON = "987654321"
ARM = "a"
UNLABELED = dg.AssetKey(layout.UNLABELED_PROBLEMS)


def test_poisoned_hidden_gold_changes_no_sample_label_reward_or_weight(
    lake_copy, sevens_model_dir, tiny_model_dir, monkeypatch
) -> None:
    rewarded: dict[str, list] = {"clean": [], "poisoned": []}
    current: list[str] = []

    reward = training.answer_reward

    @functools.wraps(reward)  # TRL names the reward's metrics after the function
    def recording_reward(completions, target, **kwargs):
        rewarded[current[0]].append((list(target), {k: list(v) for k, v in kwargs.items() if isinstance(v, list)}))
        return reward(completions, target, **kwargs)

    monkeypatch.setattr(training, "answer_reward", recording_reward)

    lakes = {"clean": lake_copy(), "poisoned": lake_copy()}
    for lake in lakes.values():  # a teacher that answers, so that there are pseudo-labels to train on
        staged = lake.staging_dir()
        shutil.copytree(sevens_model_dir, staged, dirs_exist_ok=True)
        lake.publish(staged, dg.AssetKey(layout.LABELED_RL), ARM)
    poisoned = lakes["poisoned"]
    unlabeled = poisoned.read_table(UNLABELED, ARM)
    poisoned.write_table(unlabeled.with_columns(pl.lit(POISON).alias(HIDDEN_GOLD_COLUMN)), UNLABELED, ARM)
    for name, lake in lakes.items():
        current[:] = [name]
        materialize(lake, round_names(1, layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT), tiny_config(tiny_model_dir), ARM)

    def table(name: str, asset: str) -> pl.DataFrame:
        return lakes[name].read_table(dg.AssetKey(layout.round_asset(1, asset)), ARM)

    samples = ["problem_id", "sample_index", "completion", "answer"]
    assert table("clean", "generations").select(samples).equals(table("poisoned", "generations").select(samples))
    assert table("clean", "pseudo_labels")["kept"].any(), "pseudo-labeled rows were trained on"
    assert table("clean", "pseudo_labels").equals(table("poisoned", "pseudo_labels"))
    assert rewarded["clean"] and rewarded["clean"] == rewarded["poisoned"]
    assert POISON not in repr(rewarded["poisoned"])
    student = dg.AssetKey(layout.round_asset(1, layout.STUDENT))
    assert weights_sha256(lakes["clean"].artifact_dir(student, ARM)) == weights_sha256(lakes["poisoned"].artifact_dir(student, ARM))
    assert POISON in poisoned.read_table(UNLABELED, ARM)[HIDDEN_GOLD_COLUMN].to_list()  # what the round read
