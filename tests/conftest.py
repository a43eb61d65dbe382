"""Shared fixtures: offline hub settings, a temporary data lake, and a tiny random model built from
SmolLM2's real tokenizer (for tests where the model's skill does not matter)."""

from __future__ import annotations

import os

# Tests run offline, on the CPU profile, whatever the caller's environment says.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.pop("NOISY_STUDENT_PROFILE", None)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

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


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama with random weights and SmolLM2's tokenizer and chat template, as safetensors."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from noisy_student_assets.checkpoints import SMOLLM2_GGUF_FILE, smollm2_gguf_path

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_gguf_path().parent), gguf_file=SMOLLM2_GGUF_FILE)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_MODEL_CONFIG,
    )
    out = tmp_path_factory.mktemp("tiny_model")
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def lake_root(tmp_path: Path) -> Path:
    root = tmp_path / "data_lake"
    root.mkdir()
    return root
