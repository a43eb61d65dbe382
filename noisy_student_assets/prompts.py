"""How a problem becomes a chat prompt. One instruction for every stage: training rewards, sampling and
evaluation must see the same prompt, or pseudo-labels and evals measure a different task than RL trained."""

from __future__ import annotations

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful math assistant. Solve the problem step by step, "
    "then write the final answer as \\boxed{answer}."
)


def build_messages(problem: str, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> list[dict[str, str]]:
    """Chat messages for one problem (the system turn is omitted when `system_prompt` is empty)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": problem}]


def render_prompt(tokenizer, problem: str, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """The prompt text through the tokenizer's chat template, ending where the assistant's answer starts."""
    return tokenizer.apply_chat_template(
        build_messages(problem, system_prompt), tokenize=False, add_generation_prompt=True
    )
