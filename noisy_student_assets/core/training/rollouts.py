"""Who samples a GRPO step's groups (no Dagster here): TRL's own generation, or the project's vLLM engine with the
step's LoRA adapter, through TRL's extension point for custom generation (`GRPOTrainer(rollout_func=...)`).

TRL samples with transformers' `generate` unless its colocated vLLM is on, and that one fails on CPU at the weight
sync. `VllmLoraRollouts` keeps one vLLM engine over the run's initial checkpoint for the whole training and, at each
optimizer step, saves the policy's current LoRA adapter and samples through it (vLLM's LoRA requests, which CPU
serves too): the engine's weights are the trainer's, adapter for adapter. Only the token ids cross over; the
log-probs of TRL's loss are TRL's own forward pass, as on its own path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks a vLLM engine can be built for (its `max_lora_rank`); an adapter of lower rank is padded."""

Sample = Callable[[list, Any], tuple[list[list[int]], list[list[int]]]]
"""Samples one completion for each of a step's prompts (each group's prompt repeated, as TRL's sampler gives them):
their token ids and the completions'."""


def trl_sample(prompts: list, trainer) -> tuple[list[list[int]], list[list[int]]]:
    """The prompts' and one completion's token ids each, as TRL's own generation samples them."""
    # TRL has no public call that samples as its own generation does (vLLM or transformers, its generation
    # config, its EOS handling); these two are what its `_generate` calls, called here, not overridden.
    prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
    completion_ids, _ = trainer._generate_single_turn(prompt_ids, None, {}, trainer.num_generations)
    return prompt_ids, completion_ids


def rollout_output(prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> dict:
    """What TRL's `rollout_func` returns for sampled token ids; no sampling log-probs, so that TRL's loss computes
    its own (it reads the sampler's only for its vLLM importance-sampling correction)."""
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank a vLLM engine can be built for that holds adapters of `rank`."""
    fitting = [allowed for allowed in VLLM_LORA_RANKS if allowed >= rank]
    if not fitting:
        raise ValueError(f"vLLM serves LoRA adapters of rank at most {VLLM_LORA_RANKS[-1]}, not {rank}")
    return fitting[0]


@dataclass
class VllmLoraRollouts:
    """TRL's `rollout_func` sampling through a vLLM engine over `init_checkpoint`, loaded once, with the policy's LoRA
    adapter as it stands at each optimizer step. Each completion's request carries its own seed, drawn from (`seed`,
    step, call, position), so that a resumed run samples what an uninterrupted one would. `close` stops the engine."""

    init_checkpoint: Path
    lora_rank: int
    seed: int
    dtype: str = "float32"
    device: str = "cpu"
    gpu_memory_utilization: float = 0.3
    _engine: Any = field(default=None, init=False, repr=False)
    _adapter_root: Path | None = field(default=None, init=False, repr=False)
    _loaded_step: int | None = field(default=None, init=False, repr=False)
    _calls: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    adapters_loaded: int = field(default=0, init=False)
    """Adapters the engine sampled through: one per optimizer step that sampled."""

    def __call__(self, prompts: list, trainer) -> dict:
        return rollout_output(*self.sample(prompts, trainer))

    def sample(self, prompts: list, trainer) -> tuple[list[list[int]], list[list[int]]]:
        """One completion for each of `prompts`, sampled with TRL's sampling settings (temperature, top-p, top-k,
        min-p, repetition penalty, completion cap, EOS tokens) from the trainer's current weights."""
        from vllm import SamplingParams

        prompt_ids, _, _ = trainer._tokenize_prompts(prompts)  # TRL's chat template and tokenization, as `trl_sample`
        if self._engine is None:
            self._engine = self._start(trainer)
        step = trainer.state.global_step
        request = self._adapter(trainer, step)
        call = self._calls[step] = self._calls.get(step, -1) + 1
        params = [
            SamplingParams(
                n=1,
                temperature=trainer.temperature,
                top_p=trainer.top_p,
                top_k=-1 if trainer.top_k in (None, 0) else trainer.top_k,
                min_p=trainer.min_p or 0.0,
                repetition_penalty=trainer.repetition_penalty,
                max_tokens=trainer.max_completion_length,
                stop_token_ids=list(trainer.eos_token_ids),
                seed=_request_seed(self.seed, step, call, position),
            )
            for position in range(len(prompt_ids))
        ]
        outputs = self._engine.generate(
            [{"prompt_token_ids": ids} for ids in prompt_ids], params, lora_request=request, use_tqdm=False
        )
        return prompt_ids, [list(output.outputs[0].token_ids) for output in outputs]

    def close(self) -> None:
        """Stop the engine's processes now, freeing their memory and cores for what runs next, and delete the saved
        adapters."""
        if self._engine is not None:
            self._engine.llm_engine.engine_core.shutdown()
            self._engine = None
        if self._adapter_root is not None:
            shutil.rmtree(self._adapter_root, ignore_errors=True)
            self._adapter_root = None

    def _start(self, trainer):
        from noisy_student_assets.core.sampling import VLLM_CPU_ENV_DEFAULTS, vllm_cpu_engine_args

        on_cpu = self.device == "cpu"
        if on_cpu:
            for name, value in VLLM_CPU_ENV_DEFAULTS.items():
                os.environ.setdefault(name, value)
        from vllm import LLM

        prompts = list(trainer.train_dataset["prompt"])
        longest_prompt = max(len(ids) for ids in trainer._tokenize_prompts(prompts)[0])
        max_model_len = longest_prompt + trainer.max_completion_length
        self._adapter_root = Path(tempfile.mkdtemp(prefix="rollout-adapters-"))
        return LLM(
            model=str(self.init_checkpoint),
            dtype=self.dtype,
            seed=self.seed,
            max_model_len=max_model_len,
            enable_lora=True,
            max_lora_rank=vllm_lora_rank(self.lora_rank),
            max_loras=1,
            **(
                vllm_cpu_engine_args(max_model_len)
                if on_cpu
                else {"gpu_memory_utilization": self.gpu_memory_utilization}
            ),
        )

    def _adapter(self, trainer, step: int):
        """vLLM's request for the policy's adapter at `step`, saved from the trainer on the step's first call (a new
        id per step, so that the engine loads it rather than reuse its cached copy of the last)."""
        from vllm.lora.request import LoRARequest

        path = self._adapter_root / f"step-{step}"
        if self._loaded_step != step:
            trainer.accelerator.unwrap_model(trainer.model).save_pretrained(str(path))
            if self._loaded_step is not None:
                shutil.rmtree(self._adapter_root / f"step-{self._loaded_step}", ignore_errors=True)
            self._loaded_step = step
            self.adapters_loaded += 1
        return LoRARequest(f"policy-step-{step}", step + 1, str(path))


def _request_seed(seed: int, step: int, call: int, position: int) -> int:
    digest = hashlib.sha256(f"{seed}/{step}/{call}/{position}".encode()).digest()
    return int.from_bytes(digest[:6], "big")
