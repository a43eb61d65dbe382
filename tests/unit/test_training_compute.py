"""The compute a checkpoint and its lineage spent, and the comparison a round's controls are checked by."""

from __future__ import annotations

from pathlib import Path

from noisy_student_assets.core.settings import GRPOSettings
from noisy_student_assets.core.training.compute import (
    TrainingCompute,
    compute_comparison,
    grpo_compute,
    read_compute,
    recipe_mismatches,
    record_compute,
    training_recipe,
)
from noisy_student_assets.core.training.dynamic_sampling import GENERATED_COMPLETIONS, GENERATED_TOKENS
from noisy_student_assets.core.training.shared_prefix import (
    LOSS_TOKENS_COMPLETIONS,
    LOSS_TOKENS_COMPUTED,
    LOSS_TOKENS_UNSHARED,
)


def test_grpo_compute_counts_steps_prompts_completions_and_tokens() -> None:
    history = [
        {"completions/mean_length": 10.0, "step": 1},
        {"completions/mean_length": 20.5, "step": 2},
        {"train_loss": 0.1},
    ]
    assert grpo_compute(history, steps=2, prompts_per_step=2, num_generations=8) == TrainingCompute(
        optimizer_steps=2,
        prompts=4,
        completions=32,
        generated_tokens=round((10.0 + 20.5) * 16),
        generated_completions=32,
    )


def test_grpo_compute_counts_the_groups_dynamic_sampling_generated_and_dropped() -> None:
    history = [
        {"completions/mean_length": 10.0, GENERATED_COMPLETIONS: 24.0, GENERATED_TOKENS: 250.0, "step": 1},
        {"completions/mean_length": 20.0, GENERATED_COMPLETIONS: 16.0, GENERATED_TOKENS: 320.0, "step": 2},
    ]
    compute = grpo_compute(history, steps=2, prompts_per_step=2, num_generations=8)
    assert (compute.completions, compute.generated_completions, compute.generated_tokens) == (32, 40, 570)


def test_grpo_compute_sums_the_loss_token_counts_each_step_logged() -> None:
    """The shared-prefix loss's counts (`shared_prefix.LOSS_TOKENS`), one sum a step: what the loss computed beside
    TRL's layout and the completion tokens trained on, none of them matched."""
    history = [
        {"completions/mean_length": 10.0, LOSS_TOKENS_COMPUTED: 300.0, LOSS_TOKENS_UNSHARED: 900.0, "step": 1},
        {"completions/mean_length": 12.0, LOSS_TOKENS_COMPUTED: 320.0, LOSS_TOKENS_UNSHARED: 960.0, "step": 2},
    ]
    history[0][LOSS_TOKENS_COMPLETIONS], history[1][LOSS_TOKENS_COMPLETIONS] = 160.0, 192.0
    compute = grpo_compute(history, steps=2, prompts_per_step=2, num_generations=8)
    assert (compute.loss_tokens, compute.loss_tokens_unshared, compute.trained_tokens) == (620, 1860, 352)
    assert not compute.mismatches(TrainingCompute(optimizer_steps=2, prompts=4, completions=32))


def test_a_checkpoint_records_its_lineage_and_a_reused_record_is_rewritten(tmp_path: Path) -> None:
    base, first, second = (tmp_path / name for name in ("base", "first", "second"))
    for directory in (base, first, second):
        directory.mkdir()
    step = TrainingCompute(optimizer_steps=3, prompts=6, completions=48, generated_tokens=500)
    assert read_compute(base).total == TrainingCompute()  # the base model spent nothing
    recipe = training_recipe(GRPOSettings())
    record_compute(first, step, base, recipe)
    (second / "compute.json").hardlink_to(first / "compute.json")  # a reused checkpoint shares the file
    record_compute(second, step, first, recipe)
    assert read_compute(first).total == step, "rewriting the reused record left the original alone"
    assert (
        read_compute(second).total == step + step
        and read_compute(second).own == step
        and read_compute(second).recipe == recipe
    )


def test_matched_compute_compares_steps_prompts_and_completions_only() -> None:
    spent = {"compute/total_optimizer_steps": 9.0, "compute/total_prompts": 18.0, "compute/total_completions": 144.0}
    generated = {"compute/total_generated_tokens": 900.0, "compute/total_generated_completions": 160.0}
    matched, table = compute_comparison(
        spent | generated, spent | {"compute/total_generated_tokens": 100.0, "compute/total_generated_completions": 144}
    )
    assert matched and table["compute"].to_list() == [
        "optimizer_steps",
        "prompts",
        "completions",
        "generated_tokens",
        "generated_completions",
        "loss_tokens",
        "loss_tokens_unshared",
        "trained_tokens",
    ]
    assert not compute_comparison(spent, spent | {"compute/total_optimizer_steps": 10.0})[0]
    assert not compute_comparison(spent, {})[0]
    assert TrainingCompute(optimizer_steps=3).mismatches(TrainingCompute(optimizer_steps=2)) == [
        "optimizer_steps 3 != 2"
    ]


def test_a_control_must_train_with_its_student_s_recipe() -> None:
    student = training_recipe(GRPOSettings())
    assert (
        recipe_mismatches(training_recipe(GRPOSettings(max_steps=9, seed=3)), student) == []
    )  # the budget and seed are not the recipe
    assert recipe_mismatches(training_recipe(GRPOSettings(learning_rate=1e-3)), student) == [
        "learning_rate 0.001 != 0.0002"
    ]
    assert recipe_mismatches(training_recipe(GRPOSettings(lora_r=4, lora_alpha=8)), student) == [
        "lora_r 4 != 16",
        "lora_alpha 8 != 32",
    ]
    other = GRPOSettings(max_completion_length=32, num_generations=4, temperature=1.0)
    assert len(recipe_mismatches(training_recipe(other), student)) == 3
    full = training_recipe(GRPOSettings(use_lora=False))
    assert "lora_r" not in full and recipe_mismatches(full, student)[0] == "use_lora False != True"
    assert recipe_mismatches({}, student) == []  # a checkpoint from before recipes: not compared (the check says so)
