"""The TRL datasets of the student's SFT and DPO modes (tests/model/test_sft_dpo.py trains on them)."""

from __future__ import annotations

import polars as pl

from noisy_student_assets.core.prompts import build_messages
from noisy_student_assets.core.pseudo_labels.student_data import sft_rows
from noisy_student_assets.core.training.modes.sft import build_sft_dataset
from tests.training_data import votes


def test_training_sets_keep_each_problem_s_group_together_in_a_seeded_order() -> None:
    rows = sft_rows(*votes(), group_size=4)
    dataset = build_sft_dataset(rows, "", seed=0)
    order = list(dataset["problem_id"])
    groups = [order[i : i + 4] for i in range(0, len(order), 4)]
    assert all(len(set(group)) == 1 for group in groups) and len(groups) == 6
    assert [g[0] for g in groups] != sorted(g[0] for g in groups)  # shuffled...
    assert order == list(build_sft_dataset(rows, "", seed=0)["problem_id"])  # ...by the seed
    assert order != list(build_sft_dataset(rows, "", seed=1)["problem_id"])
    assert dataset[0]["prompt"] == build_messages(votes()[1].filter(pl.col("problem_id") == order[0])["prompt"].item())
    assert dataset[0]["completion"][0]["role"] == "assistant"


def test_dpo_set_is_conversational_preference_rows(dpo_set) -> None:
    assert set(dpo_set.column_names) == {"prompt", "chosen", "rejected"}
    assert len(dpo_set) == 6 * 2  # every problem has a dissenting sample (an 8, or no answer): two pairs each
    row = dpo_set[0]
    assert row["chosen"] == [{"role": "assistant", "content": "It is \\boxed{7}"}]
    assert row["rejected"][0]["content"] in ("It is \\boxed{8}", "no idea")
