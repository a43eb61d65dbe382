"""Dynamic sampling (Yu et al. 2025, "DAPO", section 3.2; verl's and NeMo-RL's `dynamic_sampling`), through TRL's
extension point for custom generation (`GRPOTrainer(rollout_func=...)`; no Dagster here).

A GRPO group whose completions all get the same reward has zero advantage, so it carries no gradient, yet costs a
full share of the step. Each step's groups are sampled, and every group of equal rewards is dropped and replaced by a
group of another training prompt, drawn by the run's seed, until none is left or the step has replaced
`max_replacements` groups; past the bound, the groups of equal rewards that remain are trained on (they add nothing
to the gradient). The groups are sampled as the run samples without it (`sample`: TRL's own generation, or the
project's vLLM engine holding the step's weights, `rollouts`), and the rewards that decide are the loss's own reward
functions and weights; TRL grades the kept groups again for the loss.

A replacement group trains on its own prompt and is rewarded against its own row: the rollout returns the kept rows'
fields (target, label source, ...) with the completions, which TRL hands the reward functions in place of the
sampled rows' (TRL's completion log, `grpo.logged_completions`, still names the prompt it drew for the group, while
the completions, rewards and advantages are the replacement's). Each step's dropped groups and generated completions
and tokens reach the reward functions too (`STEP_COUNTS`), which log them (`grpo.answer_reward`), so that the compute
accounting counts what was generated, not only what was trained on (`compute.grpo_compute`).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from noisy_student_assets.core.training.rollouts import Sample, trl_sample

if TYPE_CHECKING:
    from datasets import Dataset

DROPPED_GROUPS = "dynamic_sampling/dropped_groups"
GENERATED_COMPLETIONS = "dynamic_sampling/generated_completions"
GENERATED_TOKENS = "dynamic_sampling/generated_tokens"
STEP_COUNTS = (DROPPED_GROUPS, GENERATED_COMPLETIONS, GENERATED_TOKENS)
"""What a step's rollout counts, logged every step under these names."""


def carries_gradient(rewards: list[float | None]) -> bool:
    """Whether a group's rewards differ, so that some completion gets a non-zero advantage; an ungraded reward (None)
    is left out of the group's baseline, as TRL leaves it out."""
    graded = [reward for reward in rewards if reward is not None]
    return len(set(graded)) > 1


def weighted_rewards(
    reward_funcs: list[Callable], weights: list[float], completions: list, fields: dict[str, list]
) -> list[float | None]:
    """Each completion's reward as TRL sums it: the reward functions' rewards times their weights, an ungraded one
    left out; None where every function leaves the completion ungraded."""
    per_func = [func(completions=completions, **fields) for func in reward_funcs]
    totals = []
    for rewards in zip(*per_func, strict=True):
        graded = [w * r for w, r in zip(weights, rewards, strict=True) if r is not None and not math.isnan(r)]
        totals.append(sum(graded) if graded else None)
    return totals


@dataclass
class DynamicSampling:
    """TRL's `rollout_func` for a run on `dataset` (rows as `grpo.build_training_dataset` makes them)."""

    dataset: Dataset
    reward_funcs: list[Callable]
    reward_weights: list[float]
    num_generations: int
    max_replacements: int
    seed: int
    sample: Sample = trl_sample
    """Who samples the groups (`rollouts`): TRL's own generation, or `rollouts.VllmRollouts.sample`."""

    def __post_init__(self) -> None:
        self._rows = list(self.dataset)
        self._row_of = {_key(row["prompt"]): row for row in self._rows}

    def __call__(self, prompts: list, trainer) -> dict:
        """Sample the groups of `prompts` (each prompt `num_generations` times in a row, as TRL's sampler gives
        them), replacing groups of equal rewards; the kept groups' prompt and completion token ids, and every kept
        row's fields and the step's counts per completion."""
        size = self.num_generations
        pending = [self._row_of[_key(prompt)] for prompt in prompts[::size]]
        candidates = self._replacements({_key(row["prompt"]) for row in pending}, trainer.state.global_step)
        kept, dropped, generated_tokens = [], 0, 0
        replacements_left = self.max_replacements if len(self._rows) > len(pending) else 0
        while pending:
            groups = self._sample(pending, trainer)
            generated_tokens += sum(len(ids) for group in groups for ids in group[2])
            informative = [carries_gradient(group[3]) for group in groups]
            equal = [group for group, useful in zip(groups, informative, strict=True) if not useful]
            kept += [group for group, useful in zip(groups, informative, strict=True) if useful]
            replaced = min(len(equal), replacements_left)
            kept += equal[replaced:]
            dropped += replaced
            replacements_left -= replaced
            pending = [next(candidates) for _ in range(replaced)]
        generated = (len(kept) + dropped) * size
        counts = {DROPPED_GROUPS: dropped, GENERATED_COMPLETIONS: generated, GENERATED_TOKENS: generated_tokens}
        fields = [name for name in self._rows[0] if name != "prompt"]
        return {
            "prompt_ids": [ids for group in kept for ids in group[1]],
            "completion_ids": [ids for group in kept for ids in group[2]],
            "logprobs": None,
            **{name: [group[0][name] for group in kept for _ in range(size)] for name in fields},
            **{name: [count] * len(kept) * size for name, count in counts.items()},
        }

    def _sample(self, rows: list[dict], trainer) -> list[tuple[dict, list, list, list]]:
        """Each row's group as the run samples it (`sample`): the row, its prompt ids and completion ids, and the
        completions' rewards."""
        size = self.num_generations
        prompt_ids, completion_ids = self.sample([row["prompt"] for row in rows for _ in range(size)], trainer)
        texts = trainer.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        groups = []
        for index, row in enumerate(rows):
            span = slice(index * size, (index + 1) * size)
            completions = [[{"role": "assistant", "content": text}] for text in texts[span]]
            fields = {name: [value] * size for name, value in row.items() if name != "prompt"}
            rewards = weighted_rewards(self.reward_funcs, self.reward_weights, completions, fields)
            groups.append((row, prompt_ids[span], completion_ids[span], rewards))
        return groups

    def _replacements(self, in_step: set[str], step: int) -> Iterator[dict]:
        """The training rows not in the step, in an order drawn from the run's seed and the step (so that a resumed
        run draws what an uninterrupted one would), over and over."""
        others = [row for row in self._rows if _key(row["prompt"]) not in in_step]
        random.Random(f"{self.seed}-{step}").shuffle(others)
        return itertools.cycle(others)


def _key(prompt: list[dict]) -> str:
    return json.dumps(prompt, sort_keys=True)
