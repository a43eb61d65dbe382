"""The run summary, the report tables and the figures (no model: the lake is written by hand)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import polars as pl
import pytest

from noisy_student_assets import plots
from noisy_student_assets.markdown import markdown_table
from noisy_student_assets.summary import (
    accuracy_table,
    checkpoint_order,
    eval_reports,
    gold_gain_recovered,
    label_audits,
    load_metrics,
    summary_markdown,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _report(lake: Path, relative: str, accuracy: float) -> None:
    directory = lake / relative
    directory.mkdir(parents=True)
    (directory / "metrics.json").write_text(json.dumps({"metrics": {"greedy_accuracy": accuracy, "maj@4": accuracy + 0.1}}))


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    _report(tmp_path, "eval_report/round-002", 0.40)
    _report(tmp_path, "gold_label_rl_eval", 0.50)
    _report(tmp_path, "eval_report/round-001", 0.35)
    _report(tmp_path, "base_model_eval", 0.10)
    _report(tmp_path, "labeled_rl_eval", 0.30)
    (tmp_path / "base_model").mkdir()  # a checkpoint, not a report: ignored
    audit = {"tau": 0.5, "coverage": 0.25, "kept": 16.0, "mean_agreement": 0.4, "kept_label_accuracy": 0.8,
             "all_label_accuracy": 0.6, "teacher_pass_at_1": 0.3}
    (tmp_path / "pseudo_labels" / "round-001").mkdir(parents=True)
    (tmp_path / "pseudo_labels" / "round-001" / "audit.json").write_text(json.dumps(audit))
    return tmp_path


def test_reports_come_base_labeled_rounds_then_the_gold_control(lake: Path) -> None:
    assert [name for name, _ in eval_reports(lake)] == ["base_model", "labeled_rl", "round-001", "round-002", "gold_label_rl"]
    assert sorted(["gold_label_rl", "round-010", "base_model", "round-002", "labeled_rl"], key=checkpoint_order) == [
        "base_model", "labeled_rl", "round-002", "round-010", "gold_label_rl"
    ]


def test_gold_gain_recovered_is_the_share_of_the_controls_gain() -> None:
    assert gold_gain_recovered(0.35, labeled_rl=0.30, gold_label_rl=0.50) == pytest.approx(0.25)
    assert gold_gain_recovered(0.25, labeled_rl=0.30, gold_label_rl=0.50) == pytest.approx(-0.25)
    assert math.isnan(gold_gain_recovered(0.35, labeled_rl=0.30, gold_label_rl=0.30))  # no gain to recover


def test_summary_tables(lake: Path) -> None:
    metrics = load_metrics(lake)
    table = accuracy_table(metrics, seed=3)
    assert table["checkpoint"].to_list() == list(metrics) and set(table["seed"]) == {"3"}
    assert table.columns == ["checkpoint", "seed", "greedy_accuracy", "maj@4"]  # only what the reports hold
    assert table["maj@4"].to_list() == pytest.approx([0.2, 0.4, 0.45, 0.5, 0.6])
    audits = label_audits(lake)
    assert audits.to_dicts() == [{"round": "round-001", "tau": 0.5, "coverage": 0.25, "kept": 16.0, "mean_agreement": 0.4,
                                  "kept_label_accuracy": 0.8, "all_label_accuracy": 0.6, "teacher_pass_at_1": 0.3}]
    text = summary_markdown(metrics, audits)
    assert "labeled RL 0.300, gold-label control 0.500" in text
    assert "| round-001 | 0.35 | 0.25 |" in text and "| round-002 | 0.4 | 0.5 |" in text
    assert "## Pseudo-labels" in text


def test_headline_metrics_take_every_k_in_order_and_leave_gaps_blank() -> None:
    metrics = {"a": {"maj@16": 0.5, "greedy_accuracy": 0.1, "pass@2": 0.3, "maj@2": 0.2, "delta_vs_x/maj@2": 0.0},
               "b": {"greedy_accuracy": 0.2, "format_rate": 1.0}}
    table = accuracy_table(metrics)
    assert table.columns == ["checkpoint", "seed", "greedy_accuracy", "maj@2", "maj@16", "pass@2", "format_rate"]
    assert table.row(1, named=True)["maj@2"] is None


def test_summary_without_the_control_says_nothing_of_it(lake: Path) -> None:
    metrics = {k: v for k, v in load_metrics(lake).items() if k != "gold_label_rl"}
    assert "Gold-label" not in summary_markdown(metrics, label_audits(lake))


def test_markdown_table_formats_and_escapes() -> None:
    frame = pl.DataFrame({"name": ["a|b", None], "value": [0.123456, float("nan")], "text": ["x\ny", "z" * 100]})
    lines = markdown_table(frame, max_chars=10).splitlines()
    assert lines[0] == "| name | value | text |"
    assert lines[2] == "| a\\|b | 0.1235 | x y |"
    assert lines[3] == "| n/a | n/a | zzzzzzzzz… |"
    assert len(markdown_table(frame, max_rows=1).splitlines()) == 3


def _image_size(png: bytes) -> tuple[int, int]:
    import matplotlib.image

    assert png.startswith(PNG_SIGNATURE)
    height, width, _ = matplotlib.image.imread(io.BytesIO(png)).shape
    return width, height


def test_figures_are_pngs() -> None:
    accuracy = pl.DataFrame(
        {"checkpoint": ["base_model", "round-001"] * 3, "seed": ["0", "0", "1", "1", "2", "2"],
         "greedy_accuracy": [0.1, 0.3, 0.12, 0.28, 0.08, 0.35]}
    )
    buckets = pl.DataFrame({"bucket": ["[0.0, 0.3)", "[0.3, 0.5)"], "problems": [3, 0], "label_accuracy": [0.5, None]})
    for png in (
        plots.accuracy_by_checkpoint(accuracy),
        plots.accuracy_by_checkpoint(accuracy.filter(pl.col("seed") == "0")),
        plots.agreement_histogram([0.25, 0.5, 1.0], tau=0.5, k=8),
        plots.label_accuracy_vs_agreement(buckets),
    ):
        assert _image_size(png) == (640, 360)
