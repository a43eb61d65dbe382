"""`make gpu-check` on a machine without CUDA stops at once, before it writes anything, saying what it needs and what
`--force-cpu` does; forced, its functional round (the tiny models through every stage, each heavy stage a payload
process) runs on the CPU and passes. tests/e2e/test_offline_install.py runs it again in the venv a wheelhouse was
installed into."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tools.gpu_check import NO_CUDA_EXIT
from tools.wheelhouse import REPO_ROOT

pytestmark = pytest.mark.e2e


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run")
def test_without_cuda_the_gpu_check_refuses_at_once_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = subprocess.run(
        ["make", "gpu-check", f"GPU_CHECK_OUT={out}", "BUDGET_MIN=1", f"CHECK_PYTHON={sys.executable}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert f"gpu-check: no CUDA device: torch {torch.__version__}" in result.stderr, result.stderr
    assert "--force-cpu" in result.stderr
    assert not out.exists(), "nothing is written: it stops before loading any model"

    direct = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check", "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert direct.returncode == NO_CUDA_EXIT


def test_forced_onto_the_cpu_its_functional_round_passes_with_every_payload_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check", "--force-cpu", "--round", "functional", "--out", str(out)],
        cwd=REPO_ROOT,
        env=os.environ | {"TMPDIR": str(tmp_path)},  # a device lock of its own, as the grid's tests take
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    functional = report["rounds"]["functional"]
    assert report["passed"] and functional["passed"] and functional["grid_exit"] == 0
    assert functional["checks"] and all(check["outcome"] == "passed" for check in functional["checks"])
    assert set(functional["payload_devices"].values()) == {"cpu"}, functional["payload_devices"]
    assert (out / "report.md").is_file()
