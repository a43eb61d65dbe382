"""The hidden gold of unlabeled problems reaches the audit and nothing else: a round on a lake whose hidden
gold is poisoned samples, labels, rewards and trains exactly as the round on the clean lake, whose gold agrees with
the teacher (so that a filter by the gold would change what the student trains on), and its pseudo-labels reach
the reward. The same holds for a test-time arm, whose hidden gold is the held-out set's."""

from __future__ import annotations

import functools
import shutil

import dagster as dg
import polars as pl
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.checkpoints import weights_sha256
from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN, eval_halves
from noisy_student_assets.core.training import grpo as training
from noisy_student_assets.core.training.base import PSEUDO
from resources.data_lake import DataLake
from tests.lakes import materialize
from tests.tiny_configs import round_names, tiny_config, with_op_config

POISON = "987654321"
SEVEN = "7"
"""What the sevens teacher answers."""
ARM = "a"
UNLABELED = dg.AssetKey(layout.UNLABELED_PROBLEMS)
EVAL = dg.AssetKey(layout.EVAL_PROBLEMS)
ROUND_1 = round_names(1, layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT)


class RewardLog:
    """The targets and extra columns of every GRPO reward call, by the lake (`current`) whose round made it."""

    def __init__(self) -> None:
        self.current = ""
        self.calls: dict[str, list] = {}


@pytest.fixture
def rewards(monkeypatch) -> RewardLog:
    log = RewardLog()
    reward = training.answer_reward

    @functools.wraps(reward)  # TRL names the reward's metrics after the function
    def recording_reward(completions, target, **kwargs):
        log.calls.setdefault(log.current, []).append(
            (list(target), {k: list(v) for k, v in kwargs.items() if isinstance(v, list)})
        )
        return reward(completions, target, **kwargs)

    monkeypatch.setattr(training, "answer_reward", recording_reward)
    return log


def _assert_round_1_unchanged(lakes: dict[str, DataLake], rewards: RewardLog) -> None:
    """The clean and poisoned lakes' round 1: the same samples, labels, rewards and student weights, no poison in
    them."""

    def table(name: str, asset: str) -> pl.DataFrame:
        return lakes[name].read_table(dg.AssetKey(layout.round_asset(1, asset)), ARM)

    samples = ["problem_id", "sample_index", "completion", "answer"]
    assert table("clean", "generations").select(samples).equals(table("poisoned", "generations").select(samples))
    assert table("clean", "pseudo_labels")["kept"].any(), "pseudo-labeled rows were trained on"
    assert table("clean", "pseudo_labels").equals(table("poisoned", "pseudo_labels"))
    assert POISON not in repr(table("poisoned", "pseudo_labels").rows())
    assert any(PSEUDO in extra["label_source"] for _, extra in rewards.calls["clean"]), "a pseudo-label was rewarded"
    assert rewards.calls["clean"] == rewards.calls["poisoned"]
    assert POISON not in repr(rewards.calls["poisoned"])
    student = dg.AssetKey(layout.round_asset(1, layout.STUDENT))
    assert weights_sha256(lakes["clean"].artifact_dir(student, ARM)) == weights_sha256(
        lakes["poisoned"].artifact_dir(student, ARM)
    )


def test_poisoned_hidden_gold_changes_no_sample_label_reward_or_weight(
    lake_copy, sevens_model_dir, tiny_model_dir, rewards
) -> None:
    lakes = {"clean": lake_copy(), "poisoned": lake_copy()}
    for lake in lakes.values():  # a teacher that answers, so that there are pseudo-labels to train on
        staged = lake.staging_dir()
        shutil.copytree(sevens_model_dir, staged, dirs_exist_ok=True)
        lake.publish(staged, dg.AssetKey(layout.LABELED_RL), ARM)
    # The clean gold is what the teacher says: a leak that filtered the student's rows by the gold would keep them
    # on the clean lake and drop them on the poisoned one.
    for name, gold in (("clean", SEVEN), ("poisoned", POISON)):
        unlabeled = lakes[name].read_table(UNLABELED, ARM)
        lakes[name].write_table(unlabeled.with_columns(pl.lit(gold).alias(HIDDEN_GOLD_COLUMN)), UNLABELED, ARM)
    poisoned = lakes["poisoned"]
    for name, lake in lakes.items():
        rewards.current = name
        materialize(lake, ROUND_1, tiny_config(tiny_model_dir), ARM)

    _assert_round_1_unchanged(lakes, rewards)
    assert POISON in poisoned.read_table(UNLABELED, ARM)[HIDDEN_GOLD_COLUMN].to_list()  # what the round read


def test_a_test_time_arm_s_poisoned_eval_gold_changes_no_sample_label_reward_or_weight(
    sevens_lake_copy, sevens_model_dir, rewards
) -> None:
    lakes = {"clean": sevens_lake_copy(), "poisoned": sevens_lake_copy()}
    poisoned = lakes["poisoned"]
    poisoned.write_table(poisoned.read_table(EVAL, ARM).with_columns(pl.lit(POISON).alias("gold_answer")), EVAL, ARM)
    config = with_op_config(tiny_config(sevens_model_dir), "problem_split", test_time=True)
    for name, lake in lakes.items():
        rewards.current = name
        materialize(lake, [layout.UNLABELED_PROBLEMS], config, ARM)
        materialize(lake, ROUND_1, config, ARM)

    _assert_round_1_unchanged(lakes, rewards)
    unlabeled = poisoned.read_table(UNLABELED, ARM)
    assert set(unlabeled["problem_id"]) <= set(eval_halves(poisoned.read_table(EVAL, ARM))[0]["problem_id"])
    assert (
        unlabeled[HIDDEN_GOLD_COLUMN].to_list() == [POISON] * 3
    )  # what the round read: the eval set's gold (its 3-problem half)
