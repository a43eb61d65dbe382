"""Static guards on the package's sources: nothing unpickles, nothing turns on remote code or pickled weights.

(The loader's behaviour itself is tested in test_checkpoints.py; TRL's resume reads its optimizer state
with torch's `weights_only` loader, which rebuilds tensors only.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(REPO / "noisy_student_assets").rglob("*.py"), *(REPO / "resources").rglob("*.py")])
FORBIDDEN = {
    "unpickling": re.compile(
        r"\bimport pickle\b|\bpickle\.loads?\(|\bcloudpickle\b|\bjoblib\b|read_pickle|torch\.load\("
    ),
    "remote code on": re.compile(r"trust_remote_code\s*=\s*True"),
    "pickled weights": re.compile(r"use_safetensors\s*=\s*False|safe_serialization\s*=\s*False"),
}


@pytest.mark.parametrize("name", FORBIDDEN)
def test_no_source_does_it(name: str) -> None:
    assert SOURCES, "the package sources were found"
    hits = [
        f"{path.relative_to(REPO)}:{number}"
        for path in SOURCES
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if FORBIDDEN[name].search(line)
    ]
    assert hits == []
