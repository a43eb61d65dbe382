"""Where the project's sampling spends more than plain vLLM: the same teacher, prompts and decoding sampled from plain
`LLM.chat` towards the project's sampling stage one difference at a time, each step an engine of its own (its start
included, as in the plain script and the stage), so that each step's seconds less the previous step's are that
difference's cost.

`benchmarks.run` calls `sampling_gap` right after the plain script's sampling, on its teacher and problems; the
round's table prints the steps.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

STEPS = (
    "plain: `LLM.chat`, one `SamplingParams` for every prompt (`benchmarks.plain`)",
    "the project's prompt token ids and CPU engine arguments (KV cache size, no chunked prefill, batched-token budget)",
    "and one request per problem with a seed of its own",
    "and the chosen token's log-prob at each position (`logprobs=0`)",
    "and one `generate` call per shard of `shard_size` problems",
    "the project's sampling: `sampling.generate` with shards, each shard written as parquet",
)
"""Per-request seeds come after the engine arguments: with chunked prefill on, vLLM's CPU sampler refuses a seeded
request whose prefill is split (`vllm_engine.cpu_engine_args`)."""


def sampling_gap(teacher: Path, problems, settings: dict, shard_size: int, dtype: str) -> list[dict]:
    """Each of `STEPS` timed on `teacher` and `problems` (problem_id, prompt) with the sampling `settings` (the
    generations asset's `sampling` metadata): its seconds, completions and generated tokens."""
    from benchmarks.plain import plain_vllm
    from noisy_student_assets.core.sampling import (
        SAMPLING_KV_CACHE_BYTES,
        SampleShards,
        SamplingSettings,
        _vllm_sampling_params,
        generate,
    )
    from noisy_student_assets.core.vllm_engine import cpu_engine_args

    decoding = SamplingSettings(
        **{name: settings[name] for name in ("n", "temperature", "top_p", "max_new_tokens", "seed")}
    )
    prompts = problems["prompt"].to_list()
    plain = plain_vllm(
        teacher,
        prompts,
        n=decoding.n,
        temperature=decoding.temperature,
        top_p=decoding.top_p,
        max_tokens=decoding.max_new_tokens,
        seed=decoding.seed,
        dtype=dtype,
    )
    rows = [{"step": STEPS[0], **plain}]
    ids, token_ids = problems["problem_id"].to_list(), prompt_token_ids(teacher, prompts)
    requests = [{"prompt_token_ids": tokens} for tokens in token_ids]
    max_model_len = max(map(len, token_ids)) + decoding.max_new_tokens
    project_engine = cpu_engine_args(max_model_len, SAMPLING_KV_CACHE_BYTES) | {"max_model_len": max_model_len}
    seeded = [_vllm_sampling_params(decoding, problem_id) for problem_id in ids]
    without_logprobs = [params.clone() for params in seeded]
    for params in without_logprobs:
        params.logprobs = None
    unseeded = [params.clone() for params in without_logprobs]
    for params in unseeded:
        params.seed = None
    shards = [range(start, min(start + shard_size, len(ids))) for start in range(0, len(ids), shard_size)]
    everything = [range(len(ids))]
    for step, params, calls in (
        (STEPS[1], unseeded, everything),
        (STEPS[2], without_logprobs, everything),
        (STEPS[3], seeded, everything),
        (STEPS[4], seeded, shards),
    ):
        rows.append(
            {"step": step, **timed_engine(teacher, dtype, decoding.seed, project_engine, requests, params, calls)}
        )
    started = time.time()
    (table,), _ = generate(
        teacher,
        problems,
        [decoding],
        shards=[SampleShards(Path(tempfile.mkdtemp(prefix="sampling-gap-")))],
        shard_size=shard_size,
        dtype=dtype,
    )
    rows.append(
        {
            "step": STEPS[5],
            "seconds": time.time() - started,
            "completions": table.height,
            "generated_tokens": int(table["n_tokens"].sum()),
        }
    )
    return rows


def prompt_token_ids(teacher: Path, prompts: list[str]) -> list[list[int]]:
    """The prompts as the project's sampling tokenizes them (`prompts.render_prompt`)."""
    from transformers import AutoTokenizer

    from noisy_student_assets.core.prompts import DEFAULT_SYSTEM_PROMPT, render_prompt

    tokenizer = AutoTokenizer.from_pretrained(str(teacher))
    return [
        tokenizer(render_prompt(tokenizer, prompt, DEFAULT_SYSTEM_PROMPT), add_special_tokens=False).input_ids
        for prompt in prompts
    ]


def timed_engine(teacher: Path, dtype: str, seed: int, engine: dict, requests: list, params: list, calls) -> dict:
    """An engine over `teacher` with `engine`'s arguments sampling `requests` with `params`, one `generate` call per
    range of `calls`: seconds from the engine's start to its shutdown, completions and generated tokens."""
    from vllm import LLM

    started = time.time()
    llm = LLM(model=str(teacher), dtype=dtype, seed=seed, **engine)
    outputs = []
    for call in calls:
        outputs += llm.generate([requests[i] for i in call], [params[i] for i in call], use_tqdm=False)
    llm.llm_engine.engine_core.shutdown()
    completions = [completion for output in outputs for completion in output.outputs]
    return {
        "seconds": time.time() - started,
        "completions": len(completions),
        "generated_tokens": sum(len(completion.token_ids) for completion in completions),
    }


def markdown(rows: list[dict]) -> list[str]:
    """The steps as a table: each one's seconds, its difference from the step before and its ratio to plain."""
    plain = rows[0]["seconds"]
    lines = [
        "| step towards the project's sampling | s | + s over the step before | / plain | tokens |",
        "|---|---|---|---|---|",
    ]
    previous = plain
    for row in rows:
        lines.append(
            f"| {row['step']} | {row['seconds']:.1f} | {row['seconds'] - previous:+.1f} | "
            f"{row['seconds'] / plain:.3f} | {row['generated_tokens']} |"
        )
        previous = row["seconds"]
    return lines
