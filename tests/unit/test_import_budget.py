"""What each entry point imports before it does anything: every Dagster step process imports the code location,
so a heavy library imported at its top is paid again in each of them. The budget is which libraries, not seconds:
each is imported where it is used (a function's own import), and this test fails when one moves back to the top."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = {
    "accelerate",
    "datasets",
    "gradio",
    "math_verify",
    "matplotlib",
    "mlflow",
    "peft",
    "ray",
    "reasoning_gym",
    "scipy",
    "torch",
    "transformers",
    "trl",
    "vllm",
}
ENTRY_POINTS = [
    "noisy_student_assets.definitions",  # the code location: each step process of `dagster asset materialize`
    "noisy_student_assets.defs.grid",  # `python -m noisy_student_assets.grid`
    "noisy_student_assets.summary",
    "noisy_student_assets.findings",
    "noisy_student_assets.headroom",
    "noisy_student_assets.payloads.__main__",  # a worker's payload, before its stage loads the model
]


def heavy_imports(module: str) -> list[str]:
    """The `HEAVY` libraries a new interpreter holds after importing `module`."""
    probe = f"import json, sys; import {module}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return sorted(HEAVY & set(json.loads(result.stdout.splitlines()[-1])))


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_an_entry_point_imports_no_heavy_library(module):
    assert heavy_imports(module) == []


def test_the_probe_sees_a_heavy_import():
    assert heavy_imports("scipy.stats") == ["scipy"]
