"""The one reader of the lake (`core.lake_reader`): the reports, the explorer and the notebooks build no artifact path
and open no artifact file themselves, and an artifact the lake lacks reads as None."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.lake_reader import ArmHours, ArmLake, RoundLabels, RoundLake
from noisy_student_assets.core.pseudo_labels.labels import AUDIT_BUCKETS_FILE, AUDIT_FILE, SETTINGS_FILE
from noisy_student_assets.core.settings import PseudoLabelSettings

REPOSITORY = Path(__file__).resolve().parents[2]
PACKAGE = REPOSITORY / "noisy_student_assets"
READERS = sorted(
    [
        *(PACKAGE / "core" / "reporting").glob("*.py"),
        PACKAGE / "explorer.py",
        PACKAGE / "summary.py",
        PACKAGE / "headroom.py",
        *(REPOSITORY / "notebooks").glob("*.py"),
    ]
)
"""What reads the lake to show it. `core/reporting/eval_report.py` is left out: it is the evaluation's own record (its
files, writer and reader), which `ArmLake.evaluation` returns."""
OWN_RECORDS = {PACKAGE / "core" / "reporting" / "eval_report.py"}
FILE_OPENERS = {
    *("read_parquet", "read_json", "scan_parquet", "read_text", "read_bytes"),
    *("exists", "is_file", "is_dir", "stat", "glob", "rglob", "iterdir"),
}


def lake_access(source: str) -> list[str]:
    """What in `source` reaches into the lake past its reader: `layout.artifact_dir`, a file name constant of an
    artifact (`*_FILE`, imported), or a call that opens or probes a file."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "artifact_dir"
            and getattr(node.value, "id", "") == "layout"
        ):
            found.append(f"line {node.lineno}: layout.artifact_dir")
        if isinstance(node, ast.ImportFrom):
            found += [
                f"line {node.lineno}: imports {alias.name}"
                for alias in node.names
                if alias.name.endswith(("_FILE", "_FILE_NAME")) or alias.name == "artifact_dir"
            ]
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in FILE_OPENERS or name == "open":
                found.append(f"line {node.lineno}: {name}()")
    return sorted(found, key=lambda line: int(line.split(":")[0].removeprefix("line ")))


def test_the_check_finds_what_reaches_past_the_reader() -> None:
    source = (
        "from noisy_student_assets.core.pseudo_labels.labels import AUDIT_FILE\n"
        "directory = layout.artifact_dir(lake, name, arm)\n"
        "if (directory / AUDIT_FILE).exists():\n"
        "    table = pl.read_parquet(directory / 'data.parquet')\n"
        "checkpoint = arm_lake.artifact_dir(layout.BASE_MODEL)\n"
    )
    assert lake_access(source) == [
        "line 1: imports AUDIT_FILE",
        "line 2: layout.artifact_dir",
        "line 3: exists()",
        "line 4: read_parquet()",
    ]


@pytest.mark.parametrize("path", [path for path in READERS if path not in OWN_RECORDS], ids=lambda path: path.name)
def test_reports_explorer_and_notebooks_read_the_lake_only_through_its_reader(path: Path) -> None:
    assert lake_access(path.read_text()) == [], f"{path.relative_to(REPOSITORY)} reaches past core/lake_reader.py"


def test_an_artifact_the_lake_lacks_reads_as_none(tmp_path: Path) -> None:
    arm_lake = ArmLake(tmp_path, "a")
    assert arm_lake.evaluation(layout.LABELED_RL_EVAL) is None
    assert arm_lake.round_evaluation(1, layout.STUDENT_ROLE) is None
    assert arm_lake.checkpoint(layout.LABELED_RL) is None
    assert arm_lake.table(layout.EVAL_PROBLEMS) is None
    assert (arm_lake.labels(1), arm_lake.verifier(1), arm_lake.promotion(2), arm_lake.grid_hours()) == (None,) * 4
    assert not arm_lake.has_results()
    with pytest.raises(FileNotFoundError, match="round 1 of arm a has no pseudo-labels"):
        RoundLake(tmp_path, "a", 1).labels()


def test_a_round_s_labels_read_from_the_lake_as_from_their_files(tmp_path: Path) -> None:
    directory = layout.artifact_dir(tmp_path, layout.round_asset(1, layout.PSEUDO_LABELS), "a")
    directory.mkdir(parents=True)
    files = {
        AUDIT_FILE: json.dumps(
            {"coverage": 0.5, "kept": 2.0, "mean_agreement": 0.6, "kept_label_accuracy": 0.5, "tau": 0.7}
            | {"all_label_accuracy": 0.5, "teacher_pass_at_1": 0.4}
        ),
        AUDIT_BUCKETS_FILE: json.dumps([{"bucket": "[0.5, 0.75)", "problems": 2, "labels_correct": 1}]),
        SETTINGS_FILE: PseudoLabelSettings(tau=0.7).model_dump_json(),
    }
    for name, text in files.items():
        (directory / name).write_text(text)
    read = ArmLake(tmp_path, "a").labels(1)
    given = RoundLabels(files, "round 1's labels")
    for labels in (read, given):
        assert (labels.audit.kept, labels.audit.tau, labels.settings.tau) == (2.0, 0.7, 0.7)
        assert labels.buckets["labels_correct"].to_list() == [1]
        assert (labels.sources, labels.frontier) == (None, None), "labels published before label sources have none"
    assert ArmLake(tmp_path, "a").has_results()


def test_the_grid_s_hours_read_back_as_recorded(tmp_path: Path) -> None:
    spent = ArmHours(experiment="e", hours=1.5, runs=3)
    ArmLake(tmp_path, "a").record_grid_hours(spent)
    assert ArmLake(tmp_path, "a").grid_hours() == spent
    assert ArmLake(tmp_path, "b").grid_hours() is None
