"""The offline install, proven on the CPU (issue 45): `make wheelhouse` for this interpreter measures the closure of
`make gpu-check`'s functional round (which must pass for the build to go on), splits it into parts; a fresh venv
holding only what a GPU node typically has (torch, transformers, peft, accelerate, pyarrow and what they require,
linked from this venv) installs the bundle with `--no-index --no-deps`, imports the code location and runs the
functional round again. A module the run imports that the bundle lacks fails the second round."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tools.wheelhouse import (
    CONTENTS,
    INSTALL_SCRIPT,
    LEFT_OUT,
    MIB,
    MODEL_DISTRIBUTION,
    NOT_CARRIED,
    PROJECT,
    REPO_ROOT,
    linked_venv,
)

pytestmark = [pytest.mark.e2e, pytest.mark.long]

ON_THE_NODE = ("torch", "triton", "transformers", "peft", "accelerate", "pyarrow")
"""What the GPU nodes seen so far had installed, beside Python (docs/offline-install.md); triton comes with torch's
CUDA builds, which require it (this venv's CPU torch does not, but imports it where it is installed)."""
PART_MIB = 20
"""Small enough that the model's wheel (about 95 MiB) and the largest runtime wheels are cut into pieces."""


def requirement_closure(names: tuple[str, ...]) -> dict[str, str]:
    """The installed distributions `names` need, with what they need in turn (their unconditional requirements
    under this interpreter): what a node with `names` installed has. Name: version."""
    todo, found = list(names), {}
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[name] = distribution.version
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found


def run(command: list, env: dict, cwd: Path = REPO_ROOT, timeout: float = 1500) -> None:
    """`command` to its end, which must succeed."""
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def test_a_wheelhouse_installed_offline_beside_what_a_node_has_runs_the_functional_round(tmp_path: Path) -> None:
    node = requirement_closure(ON_THE_NODE)
    node_list = tmp_path / "node-pip-freeze.txt"
    node_list.write_text("".join(f"{name}=={version}\n" for name, version in node.items()))
    bundle = tmp_path / "wheelhouse"
    env = os.environ | {"TMPDIR": str(tmp_path)}  # a device lock of its own: not behind another test's heavy steps
    options = ["--out", str(bundle), "--node-list", str(node_list), "--part-mib", str(PART_MIB)]
    run([sys.executable, "-m", "tools.wheelhouse", *options], env)

    contents = json.loads((bundle / CONTENTS).read_text())
    parts = sorted(bundle.glob("part-*"))
    assert parts and all(sum(f.stat().st_size for f in part.iterdir()) <= PART_MIB * MIB for part in parts)
    carried = {file["distribution"] for file in contents["files"]}
    measured = set(contents["closure"]["distributions"])
    assert {"dagster", "mlflow-skinny", "polars", "trl", "math-verify", MODEL_DISTRIBUTION} <= carried
    assert not carried & set(node), "nothing the node has travels"
    assert measured - set(node) - NOT_CARRIED - {PROJECT} <= carried, "everything else the run imported does"
    assert not measured & set(LEFT_OUT), "vLLM and Ray are imported only where installed: measured without them"
    (model,) = [file for file in contents["files"] if file["distribution"] == MODEL_DISTRIBUTION]
    assert len(model["pieces"]) > 1, "the model travels in pieces, put back together by the install script"

    python = linked_venv(tmp_path / "node", list(node), with_pip=True)
    clean = {name: value for name, value in env.items() if name not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    run([str(bundle / INSTALL_SCRIPT)], clean | {"PYTHON": str(python)})
    defs = "from noisy_student_assets.definitions import defs; print(len(list(defs.assets)))"
    run([str(python), "-c", defs], clean | {"PYTHONPATH": str(REPO_ROOT)}, cwd=tmp_path)

    report = tmp_path / "gpu-check"
    run([str(python), "-m", "tools.gpu_check", "--force-cpu", "--round", "functional", "--out", str(report)], clean)
    result = json.loads((report / "report.json").read_text())
    functional = result["rounds"]["functional"]
    assert result["passed"] and functional["checks"], result
    assert set(functional["payload_devices"].values()) == {"cpu"}, "each payload says where its stage ran"
