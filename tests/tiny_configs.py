"""Run configs that make every stage tiny (1 GRPO step, 8-token completions) for tests where the
model's skill does not matter."""

from pathlib import Path

from noisy_student_assets.checks import SMOKE_GENERATION

ROUND_SELECTION = ["generations", "pseudo_labels", "student_checkpoint", "eval_report"]

TINY_GRPO = {"max_steps": 1, "num_generations": 2, "prompts_per_step": 2, "max_completion_length": 8}
# A random model runs every completion to its (8-token) limit, often in whitespace alone, and answers nothing:
# the degenerate-output checks would stop every run, so their thresholds are off here (tests/unit/test_guards.py and
# tests/integration/test_broken_models.py test them).
RANDOM_MODEL_OUTPUT = {"min_answer_rate": 0.0, "max_truncation_rate": 1.0, "max_identical_share": 1.0}
TINY_EVAL = {"backend": "transformers", "max_new_tokens": 8, "samples": 2, "ks": [1, 2]} | RANDOM_MODEL_OUTPUT
TINY_SMOKE = {"prompts": 2, "max_new_tokens": 8, "max_empty_rate": 1.0, "max_truncation_rate": 1.0}
TINY_GREEDY_EVAL = TINY_EVAL | {"samples": 0, "ks": []}


def tiny_round(tau: float = 0.0) -> dict:
    return {
        "sampling": {"backend": "transformers", "k": 3, "max_new_tokens": 8, "shard_size": 2},
        "tau": tau,
        "min_coverage": 0.0,
        "grpo": TINY_GRPO,
    }


def smoke_checks(*checkpoints: str) -> dict:
    """Run config of the `smoke_generation` checks of `checkpoints`, for a random model."""
    return {f"{checkpoint}_{SMOKE_GENERATION}": {"config": TINY_SMOKE} for checkpoint in checkpoints}


def foundation_config(tiny_model_dir: Path) -> dict:
    return {
        "ops": {
            "problem_split": {"config": {"n_labeled": 4, "n_unlabeled": 6}},
            "eval_problems": {"config": {"source": {"kind": "reasoning_gym", "name": "basic_arithmetic", "size": 5, "seed": 9}}},
            "base_model": {"config": {"reference": str(tiny_model_dir)}},
            "labeled_rl_checkpoint": {"config": {"grpo": TINY_GRPO}},
            "base_model_eval": {"config": TINY_EVAL},
            "labeled_rl_eval": {"config": TINY_EVAL},
        }
        | smoke_checks("base_model", "labeled_rl_checkpoint")
    }


def controls_config() -> dict:
    return {
        "ops": {
            "gold_label_rl_checkpoint": {"config": {"grpo": TINY_GRPO}},
            "gold_label_rl_eval": {"config": TINY_GREEDY_EVAL},
        }
        | smoke_checks("gold_label_rl_checkpoint")
    }


def round_config(tau: float = 0.0, with_eval: bool = True) -> dict:
    ops = {"noisy_student_round": {"config": tiny_round(tau)}} | smoke_checks("student_checkpoint")
    if with_eval:
        ops["eval_report"] = {"config": TINY_EVAL}
    return {"ops": ops}
