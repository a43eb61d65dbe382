"""`make gpu-check` on a machine without CUDA stops at once, before it writes anything, saying what it needs and what
`--force-cpu` does. Its forced functional round on the CPU: tests/e2e/test_offline_install.py (it passes there
twice, once measuring the wheelhouse's closure, once in the venv the wheelhouse was installed into)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tools.gpu_check import NO_CUDA_EXIT
from tools.wheelhouse import REPO_ROOT

pytestmark = pytest.mark.e2e


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run")
def test_without_cuda_the_gpu_check_refuses_at_once_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "report"
    started = time.monotonic()
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
    assert not out.exists(), "nothing is written"
    assert time.monotonic() - started < 120, "it stops before loading any model"

    direct = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check", "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert direct.returncode == NO_CUDA_EXIT
