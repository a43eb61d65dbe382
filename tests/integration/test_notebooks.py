"""Every notebook runs from top to bottom on a round as `make run` leaves one (`inspected_lake`: a whole round 1 of arm
`a` with all three label sources, tiny model), as `make notebooks` opens it: jupytext reads the committed
percent-format source, nbclient runs it on this venv's python3 kernel, with the lake and the arm in the environment
the kernel inherits. A cell that raises fails the test with its traceback, and a library's warning printed in a cell
fails it too: the reader learns nothing from it, so it is silenced where it is raised."""

from __future__ import annotations

from pathlib import Path

import pytest

from noisy_student_assets.core import environment
from tests.conftest import INSPECTED_ARM

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
CELL_TIMEOUT_S = 600  # the GRPO step of 01 is the longest cell: a minute on the tiny model on a loaded 2-core machine
PRINTED = {"01_reward_and_grpo_step": "step 1/1: "}
"""What a notebook prints while it works: 01's training cell a line per optimizer step."""


@pytest.mark.parametrize("source", sorted(NOTEBOOKS_DIR.glob("*.py")), ids=lambda path: path.stem)
def test_the_notebook_runs_on_the_lake(source: Path, inspected_lake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jupytext
    from nbclient import NotebookClient

    monkeypatch.setenv(environment.DATA_LAKE, str(inspected_lake))
    monkeypatch.setenv(environment.ARM, INSPECTED_ARM)
    notebook = jupytext.read(source)
    NotebookClient(
        notebook, kernel_name="python3", timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}
    ).execute()
    images = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]
    assert images, "every notebook shows its figures"
    printed = "".join(
        output["text"]
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.get("name") == "stdout"
    )
    assert PRINTED.get(source.stem, "") in printed
    warned = [
        output["text"]
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.get("name") == "stderr" and "Warning" in output["text"]
    ]
    assert not warned, f"a library warning the reader learns nothing from: {warned}"
