"""The project's one vLLM engine (no Dagster here) and the one rule that seeds its requests.

`VllmEngine` starts from a checkpoint, generates from token ids, loads new weights in place and closes. Teacher
sampling, evaluation and the verifier's samples (`sampling`) and GRPO's rollouts and validation checks
(`training.rollouts`) all generate through it, each request seeded by `request_seed`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch
    from vllm import RequestOutput, SamplingParams

# vLLM on CPU, when the caller's environment does not say otherwise: vLLM keeps one core away from its compute
# threads for the scheduler process; on 2 cores that halves the compute, so both go to compute (docs/benchmark.md).
# vLLM's CPU worker, a process of its own, scans every loaded
# module for kernels when it starts and so touches torch's deprecated `torch.distributed.reduce_op`: that warning
# (vLLM's, not this project's) is silenced in the worker through the environment it inherits.
VLLM_CPU_ENV_DEFAULTS = {
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "PYTHONWARNINGS": "ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning",
}

VLLM_MIN_BATCHED_TOKENS = 4096
"""vLLM's own default token budget per engine step on CPU; raised only for longer sequences."""

KV_CACHE_BLOCK_TOKENS = 256
"""The largest block of tokens a vLLM KV cache allocates on CPU: each sequence's room is rounded up to it."""


def request_seed(*parts: object) -> int:
    """A request's own seed, drawn from `parts`: the run's seed and what names the request within the run (a
    problem's id; a GRPO step, call and position). The engine's shared generator would make samples depend on which
    requests happen to share an engine step, which varies from run to run; a per-request generator does not, so a
    resumed run, or one cut into other shards or payloads, samples what an uninterrupted one would. vLLM seeds a
    request's n samples `seed + k`."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:6], "big")


def cpu_engine_args(max_model_len: int, kv_cache_bytes: int) -> dict:
    """Engine settings for vLLM on CPU, a KV cache of `kv_cache_bytes`."""
    return {
        "kv_cache_memory_bytes": kv_cache_bytes,
        # torch.compile costs far more start-up than its faster steps win back on short CPU runs.
        "enforce_eager": True,
        # Per-request seeds crash vLLM on CPU when a prompt's prefill is split across steps ("CPU
        # Generator does not use offset"); unsplit prompts need a batch that holds the longest one.
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(max_model_len, VLLM_MIN_BATCHED_TOKENS),
    }


def kv_cache_bytes(config, dtype: str, sequences: int, max_model_len: int) -> int:
    """Bytes of KV cache that hold `sequences` sequences of `max_model_len` tokens at once for a model of `config`
    (keys and values of every layer's key-value heads). A GRPO step's groups need this much, far less than the
    sampling stage's fixed cache, which would cost a GRPO process its memory."""
    import torch

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
    per_token *= torch.empty((), dtype=getattr(torch, dtype)).element_size()
    blocks = -(-max_model_len // KV_CACHE_BLOCK_TOKENS)
    return sequences * blocks * KV_CACHE_BLOCK_TOKENS * per_token


class WeightsLoader:
    """vLLM worker extension (`LLM(worker_extension_cls=...)`): the worker's model loads the weights of a safetensors
    file (vLLM's RPC is for control messages: its serializer turns a tensor argument into nested lists). vLLM's CPU
    linear layers repack their weights after loading, so `reload_weights` rebuilds the kernel formats too."""

    def load_weights_file(self, path: str) -> None:
        from safetensors.torch import load_file

        self.model_runner.reload_weights(weights_iterator=load_file(path).items(), is_checkpoint_format=True)


class VllmEngine:
    """One vLLM engine over `checkpoint`, holding sequences of up to `max_model_len` tokens. On CPU its KV cache is
    `kv_cache_bytes` (vLLM would otherwise claim most of the machine's memory); on a GPU it takes
    `gpu_memory_utilization` of the device. The engine's own `seed` shapes no sample when every request carries its
    own (`request_seed`). A context manager: leaving it stops the engine's processes."""

    def __init__(
        self,
        checkpoint: Path,
        *,
        max_model_len: int,
        seed: int,
        dtype: str = "float32",
        device: str = "cpu",
        kv_cache_bytes: int,
        gpu_memory_utilization: float,
    ) -> None:
        on_cpu = device == "cpu"
        if on_cpu:
            for name, value in VLLM_CPU_ENV_DEFAULTS.items():
                os.environ.setdefault(name, value)
        from vllm import LLM  # imported here: slow, and only a process that generates with vLLM needs it

        self.llm = LLM(
            model=str(checkpoint),
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            logprobs_mode="raw_logprobs",  # vLLM's default, named: sampled logprobs are untempered and unfiltered
            worker_extension_cls=f"{__name__}.{WeightsLoader.__qualname__}",
            **(
                cpu_engine_args(max_model_len, kv_cache_bytes)
                if on_cpu
                else {"gpu_memory_utilization": gpu_memory_utilization}
            ),
        )
        """vLLM's own engine, for what this class does not wrap (its configuration, prompt log-probs)."""
        self._weights_dir: Path | None = None

    def generate(
        self, prompt_ids: Sequence[list[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[RequestOutput]:
        """One output for each prompt's token ids (in order), sampled with `params` (one for all, or one each)."""
        return self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load `weights` (named as the checkpoint names them; any subset) into the engine's model, and drop the
        cached keys and values of prompts, which the previous weights computed."""
        from safetensors.torch import save_file

        if self._weights_dir is None:
            self._weights_dir = Path(tempfile.mkdtemp(prefix="engine-weights-"))
        path = self._weights_dir / "weights.safetensors"
        save_file({name: weight.contiguous() for name, weight in weights.items()}, str(path))
        self.llm.collective_rpc("load_weights_file", args=(str(path),))
        path.unlink()
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Stop the engine's processes now rather than at garbage collection, so that they free their memory and
        cores for whatever runs next (another engine, a trainer)."""
        self.llm.llm_engine.engine_core.shutdown()
        if self._weights_dir is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)
            self._weights_dir = None

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
