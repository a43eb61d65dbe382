"""Dynamic sampling in a real TRL GRPO run on the tiny "sevens" model (no mocks), its groups sampled by TRL and by the
vLLM engine (`grpo.rollouts`): a step poisoned with prompts whose target no completion can reach (every completion
rewarded 0: a group of equal rewards, no gradient)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from noisy_student_assets.core.settings import ROLLOUTS
from noisy_student_assets.core.training.base import TrainingRun
from noisy_student_assets.core.training.compute import MATCHED_FIELDS, grpo_compute
from noisy_student_assets.core.training.dynamic_sampling import DROPPED_GROUPS, GENERATED_COMPLETIONS, carries_gradient
from noisy_student_assets.core.training.grpo import build_training_dataset, logged_completions, train_grpo
from tests.training_data import SYSTEM_PROMPT, TINY_RUN, labeled_frame

UNREACHABLE = "123456789"
"""A target the sevens model never answers."""


def poisoned_set():
    """Four problems whose target is 7 (the sevens model's rewards vary on them) and four it cannot reach."""
    poisoned = labeled_frame().with_columns(
        pl.concat_str(pl.lit("poisoned-"), pl.col("problem_id")).alias("problem_id"),
        pl.concat_str(pl.col("prompt"), pl.lit(" Think twice.")).alias("prompt"),
        pl.lit(UNREACHABLE).alias("gold_answer"),
    )
    return build_training_dataset(pl.concat([labeled_frame(), poisoned]), None, SYSTEM_PROMPT)


@pytest.mark.parametrize("rollouts", ROLLOUTS)
def test_groups_of_equal_reward_are_dropped_replaced_counted_and_compute_stays_matched(
    sevens_model_dir: Path, tmp_path: Path, rollouts: str
):
    replacements = 16
    settings = TINY_RUN.model_copy(
        update=dict(save_steps=0, dynamic_sampling_replacements=replacements, rollouts=rollouts)
    )
    dataset = poisoned_set()
    run = TrainingRun(tmp_path / "work")
    result = train_grpo(sevens_model_dir, dataset, settings, tmp_path / "merged", run, log_completions=True)

    steps = [entry for entry in result.log_history if DROPPED_GROUPS in entry]
    assert [entry["step"] for entry in steps] == list(range(1, settings.max_steps + 1))
    logged = logged_completions(tmp_path / "work")
    size = settings.num_generations
    for step in steps:
        trained = logged.filter(pl.col("step") == step["step"])
        groups = [trained["answer_reward"][start : start + size].to_list() for start in range(0, trained.height, size)]
        assert len(groups) == settings.prompts_per_step
        assert all(carries_gradient(group) for group in groups)  # every group of equal rewards was replaced
        poisoned_drawn = set(trained["question"]) & _poisoned_questions(dataset)
        assert step[DROPPED_GROUPS] >= len(poisoned_drawn)  # TRL's sampler drew these; none of them was trained on
        assert step[GENERATED_COMPLETIONS] == (settings.prompts_per_step + step[DROPPED_GROUPS]) * size
    assert sum(step[DROPPED_GROUPS] for step in steps) > 0

    compute = grpo_compute(result.log_history, settings.max_steps, settings.prompts_per_step, size)
    plain = grpo_compute([], settings.max_steps, settings.prompts_per_step, size)
    assert [getattr(compute, name) for name in MATCHED_FIELDS] == [getattr(plain, name) for name in MATCHED_FIELDS]
    dropped = sum(step[DROPPED_GROUPS] for step in steps)
    assert compute.generated_completions == compute.completions + dropped * size


def _poisoned_questions(dataset) -> set[str]:
    return {row["prompt"][-1]["content"] for row in dataset if row["target"] == UNREACHABLE}
