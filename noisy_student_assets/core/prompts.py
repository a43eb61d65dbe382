"""How a problem becomes a chat prompt. One format for every stage: training rewards, sampling and
evaluation must see the same prompt, or pseudo-labels and evals measure a different task than RL trained.

The instruction goes in the user turn and the system turn is left to the chat template's default:
SmolLM2-135M-Instruct got 24% of two-digit additions right greedily with this format, against 13% with
a custom "careful math assistant" system prompt (100 problems, 64 new tokens, vLLM).
"""

from __future__ import annotations

import hashlib
import json

ANSWER_INSTRUCTION = "Put the final answer in \\boxed{}."
NOISY_TEMPLATES = (
    "{problem}\n" + ANSWER_INSTRUCTION,
    "Solve the following problem. " + ANSWER_INSTRUCTION + "\n\n{problem}",
    "Question: {problem}\nGive the final result inside \\boxed{}.",
    "{problem}\nWork it out step by step, and end with the final answer in \\boxed{}.",
)
"""The student's input noise (Xie et al. 2020 noise the student's input, never the teacher's): the user turn
rendered through one of these, chosen per problem and seed. The first is the one format every other stage
uses; each asks for a \\boxed{} answer, so the reward and the grader read the same thing."""
DEFAULT_SYSTEM_PROMPT = ""
"""Empty: the chat template's own default system turn (if it has one) is used."""


def build_messages(problem: str, system_prompt: str = DEFAULT_SYSTEM_PROMPT, template: int = 0) -> list[dict[str, str]]:
    """Chat messages for one problem (the system turn is omitted when `system_prompt` is empty); `template`
    indexes `NOISY_TEMPLATES` (0: the format of every stage)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*messages, {"role": "user", "content": NOISY_TEMPLATES[template].replace("{problem}", problem, 1)}]


def noisy_template(problem_id: str, seed: int) -> int:
    """The `NOISY_TEMPLATES` index of a problem under prompt noise: a stable hash of the problem and the seed,
    so a resumed or repeated run sees the same prompts, and another seed other ones."""
    digest = hashlib.sha256(f"{seed}:{problem_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % len(NOISY_TEMPLATES)


def student_messages(problem_id: str, prompt: str, system_prompt: str, noise_seed: int | None) -> list[dict[str, str]]:
    """A training prompt's chat messages: the one format of every stage, or with `noise_seed` the noisy
    template `noisy_template` picks for the problem and seed."""
    template = noisy_template(problem_id, noise_seed) if noise_seed is not None else 0
    return build_messages(prompt, system_prompt, template)


def prompt_template(system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """The message format with a `{problem}` placeholder, for cache keys and run parameters."""
    return json.dumps(build_messages("{problem}", system_prompt))


def render_prompt(tokenizer, problem: str, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """The prompt text through the tokenizer's chat template, ending where the assistant's answer starts."""
    return tokenizer.apply_chat_template(
        build_messages(problem, system_prompt), tokenize=False, add_generation_prompt=True
    )
