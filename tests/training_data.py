"""Problems whose answer is always 7, the teacher's votes on them, and short training settings, for the training tests
(the data in tests/unit, the tiny-model runs in tests/model)."""

from __future__ import annotations

import polars as pl

from noisy_student_assets.core.settings import TRL_ROLLOUTS, GRPOSettings

SYSTEM_PROMPT = "Answer with \\boxed{}."
SEVEN = "7"

# Short runs: 2 prompts x 4 completions of at most 8 tokens per step.
TINY_RUN = GRPOSettings(
    max_steps=2,
    num_generations=4,
    prompts_per_step=2,
    max_completion_length=8,
    learning_rate=1e-2,
    temperature=1.0,
    save_steps=1,
    rollouts=TRL_ROLLOUTS,  # a vLLM engine's start would cost more than a tiny run's sampling
)


def labeled_frame(n: int = 4) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "problem_id": [f"gold-{i}" for i in range(n)],
            "prompt": [f"What is {i} + 7 - {i}?" for i in range(n)],
            "gold_answer": [SEVEN] * n,
            "source": ["reasoning_gym"] * n,
        }
    )


def pseudo_frame(n: int = 4) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "problem_id": [f"pseudo-{i}" for i in range(n)],
            "prompt": [f"What is 14 - 7 + {i} - {i}?" for i in range(n)],
            "pseudo_label": [SEVEN] * n,
            "agreement": [0.75] * n,
        }
    )


# A supervised step: 2 problems x 4 completions (SFT: 8 rows; DPO: 4 pairs).
TINY_SUPERVISED = GRPOSettings(max_steps=2, num_generations=4, prompts_per_step=2, learning_rate=1e-2, save_steps=1)
ANSWERS = {f"p{i}": ["7", "7", "7", "8"] if i % 2 else ["7", "7", None, "7"] for i in range(6)}


def votes() -> tuple[pl.DataFrame, pl.DataFrame]:
    """The teacher's samples of `ANSWERS` and the kept pseudo-label 7 of each problem."""
    generations = pl.DataFrame(
        [
            {
                "problem_id": pid,
                "sample_index": i,
                "completion": f"It is \\boxed{{{a}}}" if a else "no idea",
                "answer": a,
            }
            for pid, answers in ANSWERS.items()
            for i, a in enumerate(answers)
        ],
        schema={"problem_id": pl.Utf8, "sample_index": pl.Int32, "completion": pl.Utf8, "answer": pl.Utf8},
    )
    labels = pl.DataFrame(
        {
            "problem_id": list(ANSWERS),
            "prompt": [f"What is {i} + 7 - {i}?" for i in range(6)],
            "pseudo_label": "7",
            "kept": True,
        }
    )
    return generations, labels
