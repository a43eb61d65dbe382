"""Model references that must fail loudly, and the loader's safety defaults (safetensors only, no
remote code unless configured), on copies of the tiny test model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from noisy_student_assets.core.checkpoints import materialize_checkpoint


@pytest.fixture
def model_copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(tiny_model_dir, copy)
    return copy


def test_a_directory_that_is_not_a_checkpoint_is_named(tmp_path: Path) -> None:
    with pytest.raises(
        FileNotFoundError,
        match=r"model reference '.*/no-such-model' is not a Hugging Face checkpoint directory \(no config.json\)",
    ):
        materialize_checkpoint(str(tmp_path / "no-such-model"), tmp_path / "out")


def test_a_missing_gguf_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"model reference '.*/missing.gguf': no such GGUF file"):
        materialize_checkpoint(str(tmp_path / "missing.gguf"), tmp_path / "out")


def test_a_tokenizer_without_chat_template_is_refused(model_copy: Path, tmp_path: Path) -> None:
    (model_copy / "chat_template.jinja").unlink(missing_ok=True)
    config_path = model_copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="its tokenizer has no chat template; prompts are chat messages"):
        materialize_checkpoint(str(model_copy), tmp_path / "out")


def test_pickled_weights_are_not_loaded(model_copy: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(model_copy / "model.safetensors"), model_copy / "pytorch_model.bin")
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(OSError, match="safetensors"):
        materialize_checkpoint(str(model_copy), tmp_path / "out")


def test_a_checkpoint_with_its_own_code_is_refused_without_running_it(model_copy: Path, tmp_path: Path) -> None:
    ran = tmp_path / "remote-code-ran"
    (model_copy / "modeling_custom.py").write_text(
        f"from pathlib import Path\nPath({str(ran)!r}).write_text('ran')\n"
        "from transformers import LlamaForCausalLM\nclass CustomModel(LlamaForCausalLM):\n    pass\n"
    )
    config_path = model_copy / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = {
        "AutoConfig": "modeling_custom.CustomConfig",
        "AutoModelForCausalLM": "modeling_custom.CustomModel",
    }
    config["model_type"] = "custom-noisy"  # a type transformers does not ship: only the checkpoint's code knows it
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="trust_remote_code"):
        materialize_checkpoint(str(model_copy), tmp_path / "out")
    assert not ran.exists()
