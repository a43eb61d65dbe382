"""Tiny models with SmolLM2's real tokenizer and chat template, for runs where the model's skill does not matter: the
tests' fixtures and the functional round of `make gpu-check` build them here."""

from __future__ import annotations

import json
from pathlib import Path

# head_dim 32: vLLM's CPU attention supports no smaller head size.
TINY_MODEL_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}
SEVENS_ANSWER = "7"
"""What the sevens model mostly answers."""


def tiny_random_model(out: Path) -> Path:
    """A 2-layer Llama with random weights and SmolLM2's tokenizer and chat template, as safetensors in `out`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from noisy_student_assets.core.checkpoints import SMOLLM2_GGUF_FILE, smollm2_gguf_path

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_gguf_path().parent), gguf_file=SMOLLM2_GGUF_FILE)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_MODEL_CONFIG,
    )
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def sevens_model(tiny_model_dir: Path, out: Path) -> Path:
    """The tiny model rewired to say mostly "7" or end its turn, so that rewards vary within a group.

    A random model's answers are almost never numbers, so every reward would be 0, every advantage 0,
    and no weight would move.  Here one residual dimension dominates every input embedding, making the
    final hidden state nearly constant, and an untied output head reads only that dimension for "7"
    and end-of-turn: they get most of the probability, and "7" alone (reward 1) is a common answer.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    embedding = model.get_input_embeddings().weight
    with torch.no_grad():
        head = torch.nn.Linear(embedding.shape[1], embedding.shape[0], bias=False)
        head.weight.copy_(embedding)
        head.weight[:, 0] = 0.0
        head.weight[tokenizer.convert_tokens_to_ids(SEVENS_ANSWER), 0] = 2.05
        head.weight[tokenizer.eos_token_id, 0] = 2.0
        embedding[:, 0] = 10.0
    model.lm_head = head
    model.config.tie_word_embeddings = False
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def sevens_problems(path: Path, count: int, first: int) -> Path:
    """A JSONL problem file whose every answer is 7 (the sevens model's), so that its samples are right and wrong on
    the same problem: what a verifier learns from."""
    path.write_text(
        "".join(
            json.dumps({"question": f"What is {n} - {n - 7}?", "answer": SEVENS_ANSWER}) + "\n"
            for n in range(first, first + count)
        )
    )
    return path
