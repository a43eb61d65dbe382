"""Sampling without a model: the decoding parameters' validation, the samples' content key and the cut of a
round's problems into sampling payloads (tests/model/test_generation.py samples with both backends)."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest

from noisy_student_assets.core.sampling import (
    SamplingSettings,
    problem_parts,
    sampling_cache_key,
)
from noisy_student_assets.core.vllm_engine import request_seed

SAMPLING = SamplingSettings(n=4, temperature=1.0, top_p=0.95, max_new_tokens=12, seed=3)


def test_greedy_with_several_samples_is_rejected():
    with pytest.raises(ValueError, match="greedy"):
        SamplingSettings(n=2, temperature=0.0, max_new_tokens=8)


def test_sampling_cache_key_is_stable_and_sensitive_to_every_input():
    base = {
        "checkpoint_sha256": "a" * 64,
        "problems_fingerprint": "problems-v1",
        "settings": SAMPLING,
        "backend": "vllm",
        "prompt_template": "[{'role': 'user', 'content': '{problem}'}]",
    }
    variants = [
        {"checkpoint_sha256": "b" * 64},
        {"problems_fingerprint": "problems-v2"},
        {"backend": "transformers"},
        {"prompt_template": "[{'role': 'user', 'content': '{problem} Be careful.'}]"},
        {"settings": dataclasses.replace(SAMPLING, n=5)},
        {"settings": dataclasses.replace(SAMPLING, temperature=0.7)},
        {"settings": dataclasses.replace(SAMPLING, top_p=0.9)},
        {"settings": dataclasses.replace(SAMPLING, max_new_tokens=13)},
        {"settings": dataclasses.replace(SAMPLING, seed=4)},
    ]
    key = sampling_cache_key(**base)
    assert key == sampling_cache_key(**base) and len(key) == 64
    keys = {sampling_cache_key(**(base | change)) for change in variants}
    assert key not in keys and len(keys) == len(variants)
    # transformers' samples depend on how prompts are batched, vLLM's do not
    assert sampling_cache_key(**base, batch_size=64) == key
    transformers = base | {"backend": "transformers"}
    assert sampling_cache_key(**transformers, batch_size=64) != sampling_cache_key(**transformers, batch_size=16)


@pytest.mark.parametrize(
    ("rows", "parts", "sizes"), [(7, 3, [2, 3, 2]), (6, 3, [2, 2, 2]), (2, 3, [1, 1]), (5, 1, [5])]
)
def test_problem_parts_are_contiguous_near_equal_and_give_the_problems_back(
    rows: int, parts: int, sizes: list[int]
) -> None:
    problems = pl.DataFrame({"problem_id": [f"p{i}" for i in range(rows)], "prompt": ["?"] * rows})
    cut = problem_parts(problems, parts)
    assert [part.height for part in cut] == sizes
    assert pl.concat(cut).equals(problems)


def test_a_request_s_seed_is_the_rule_every_lake_was_sampled_with() -> None:
    """The one seed rule (`vllm_engine.request_seed`) of a teacher's sample of a problem (seed, problem id) and of a
    GRPO rollout (seed, step, call, position): pinned, since changing it changes every sample a lake would draw."""
    assert request_seed(7, "p-3") == 195877683085039
    assert request_seed(0, 2, 1, 5) == 152199413972356
