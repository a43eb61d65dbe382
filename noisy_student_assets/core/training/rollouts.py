"""Who samples a GRPO step's groups (no Dagster here): TRL's own generation, or the project's vLLM engine holding the
policy's current weights, through TRL's extension point for custom generation (`GRPOTrainer(rollout_func=...)`).

TRL samples with transformers' `generate` unless its colocated vLLM is on, and that one fails on CPU at the weight
sync: vLLM's CPU linear layers repack their weights after loading and drop the checkpoint's, so a model's own
`load_weights` finds them gone. `VllmRollouts` keeps one vLLM engine over the run's initial checkpoint for the whole
training and, at each optimizer step, loads the policy's weights into it before sampling: with LoRA, each adapted
layer's merged weight (the base weight plus the adapter's delta, the only weights LoRA training changes); without,
every parameter, loaded in place (`VllmEngine.load_weights`). Sampling through the step's adapter as a vLLM LoRA
request would need no weight transfer, but vLLM's LoRA kernels on CPU sampled SmolLM2's groups at 76 tokens/s, where
the merged weights make 142 (docs/benchmark.md). Only token ids cross back; the log-probs of TRL's loss are TRL's
own forward pass, as on its own path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noisy_student_assets.core.vllm_engine import VllmEngine, kv_cache_bytes, request_seed

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


def policy_weights(model) -> dict[str, Any]:
    """`model`'s weights as its checkpoint names them, for an engine loaded from that checkpoint: under peft, each
    LoRA-adapted layer's merged weight (base plus the active adapter's delta), the only weights LoRA training
    changes; otherwise every parameter."""
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(model, PeftModel):
        return {name: parameter.detach() for name, parameter in model.named_parameters()}
    return {
        f"{name}.weight": (module.base_layer.weight + module.get_delta_weight(module.active_adapters[0])).detach()
        for name, module in model.get_base_model().named_modules()
        if isinstance(module, LoraLayer)
    }


@dataclass
class VllmRollouts:
    """TRL's `rollout_func` sampling through the project's vLLM engine (`VllmEngine`) over `init_checkpoint`, started
    once, whose weights are the policy's as it stands at each optimizer step (`policy_weights`). Each completion's
    request is seeded from (`seed`, step, call, position) (`request_seed`), so that a resumed run samples what an
    uninterrupted one would. `close` stops the engine."""

    init_checkpoint: Path
    seed: int
    dtype: str = "float32"
    device: str = "cpu"
    extra_prompts: list = field(default_factory=list)
    """Prompts beside the training set's that the engine must fit (`greedy`'s: the validation check's)."""
    _engine: VllmEngine | None = field(default=None, init=False, repr=False)
    _loaded_step: int | None = field(default=None, init=False, repr=False)
    _calls_in_step: int = field(default=0, init=False, repr=False)

    def __call__(self, prompts: list, trainer) -> dict:
        return rollout_output(*self.sample(prompts, trainer))

    def sample(self, prompts: list, trainer) -> tuple[list[list[int]], list[list[int]]]:
        """One completion for each of `prompts`, sampled with TRL's sampling settings (temperature, top-p, top-k,
        min-p, repetition penalty, completion cap, EOS tokens) from the trainer's current weights."""
        from vllm import SamplingParams

        prompt_ids, _, _ = trainer._tokenize_prompts(prompts)  # TRL's chat template and tokenization, as `trl_sample`
        if self._engine is None:
            self._engine = self._start(trainer, sequences=len(prompt_ids))
        step = trainer.state.global_step
        if self._loaded_step != step:
            self.load_weights(trainer)
        call, self._calls_in_step = self._calls_in_step, self._calls_in_step + 1
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
                seed=request_seed(self.seed, step, call, position),
            )
            for position in range(len(prompt_ids))
        ]
        outputs = self._engine.generate(prompt_ids, params)
        return prompt_ids, [list(output.outputs[0].token_ids) for output in outputs]

    def greedy(self, prompt_ids: list[list[int]], model, step: int, max_tokens: int, stop_token_ids: list[int]):
        """The greedy completion's token ids of each of `prompt_ids` under `model`'s weights after optimizer step
        `step` (loaded as the next step's sampling would load them, so that its requests' seeds are unchanged)."""
        from vllm import SamplingParams

        if self._loaded_step != step:
            self.load_policy(model, step)
        params = SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens, stop_token_ids=stop_token_ids)
        return [list(output.outputs[0].token_ids) for output in self._engine.generate(prompt_ids, params)]

    def load_weights(self, trainer) -> None:
        """Load the trainer's current weights into the engine (`load_policy`)."""
        self.load_policy(trainer.accelerator.unwrap_model(trainer.model), trainer.state.global_step)

    def load_policy(self, model, step: int) -> None:
        """Load `model`'s weights after optimizer step `step` into the engine."""
        import torch

        with torch.no_grad():
            weights = policy_weights(model)
        self._engine.load_weights(weights)
        self._loaded_step, self._calls_in_step = step, 0

    def close(self) -> None:
        """Stop the engine's processes now, freeing their memory and cores for what runs next."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    def _start(self, trainer, sequences: int) -> VllmEngine:
        """The engine, its KV cache (on CPU) sized to hold `sequences` sequences at once, a step's groups."""
        prompts = list(trainer.train_dataset["prompt"]) + self.extra_prompts
        longest_prompt = max(len(ids) for ids in trainer._tokenize_prompts(prompts)[0])
        max_model_len = longest_prompt + trainer.max_completion_length
        return VllmEngine(
            self.init_checkpoint,
            max_model_len=max_model_len,
            seed=self.seed,
            dtype=self.dtype,
            device=self.device,
            kv_cache_bytes=(
                kv_cache_bytes(trainer.model.config, self.dtype, sequences, max_model_len)
                if self.device == "cpu"
                else 0
            ),
            # beside the trainer on its GPU: TRL's own share for a vLLM colocated with training
            gpu_memory_utilization=trainer.args.vllm_gpu_memory_utilization,
        )
