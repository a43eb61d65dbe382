"""An evaluation's published artifact (no Dagster here): what it holds, how it is written into a staging
directory, and how a published one is read back (by the next round's report, the verdict and the summary).

    scores.parquet      one row per eval problem (`problem_id`, `greedy_correct`, ...)
    breakdown.parquet   greedy accuracy per subject and level
    greedy.parquet      the greedy completions, and sampled.parquet the sampled ones (an identical eval reuses them)
    metrics.json        {"metrics": ..., "checkpoint": ..., "eval_problems": fingerprint}
    <table>.parquet     each table of the report, by its section title (`metadata_key`)
    report.md, report.html and the figures as PNG files
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from noisy_student_assets.core.evaluation import EvalResult
from noisy_student_assets.core.layout import METRICS_FILE, SCORES_FILE
from noisy_student_assets.core.reporting.markdown import markdown_table, write_report

REPORT_NAME = "report"
"""An eval's report: `report.md` (figures beside it) and `report.html` (figures inlined, for MLflow's artifact
viewer, which shows markdown as raw text)."""
DELTA_PREFIX = "delta_vs_"
"""Metrics of an eval against another checkpoint's: `delta_vs_labeled_rl/greedy_accuracy`."""
GREEDY_FILE, SAMPLED_FILE = "greedy.parquet", "sampled.parquet"
BREAKDOWN_TABLE = "By subject / level"


@dataclass(frozen=True)
class ReportExtras:
    """What an eval adds to its report once its checkpoint's metrics and scores are known."""

    metrics: dict[str, float] = field(default_factory=dict)
    figures: dict[str, bytes] = field(default_factory=dict)
    """File stem -> PNG: stored in the report dir, inlined in the metadata, logged to MLflow."""
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    """Section title -> table: in report.md and as its own metadata entry."""
    text: str = ""
    """Markdown that leads the report (a verdict)."""


@dataclass(frozen=True)
class PublishedEval:
    """A published evaluation, read back from its directory."""

    directory: Path
    metrics: dict[str, float]
    scores: pl.DataFrame

    def table(self, title: str) -> pl.DataFrame:
        """A table the report published (`ReportExtras.tables`), by its section title."""
        return pl.read_parquet(self.directory / f"{metadata_key(title)}.parquet")

    def optional_table(self, title: str) -> pl.DataFrame | None:
        """`table`, or None where this report has no such table (a round that is not test-time has no yardstick)."""
        path = self.directory / f"{metadata_key(title)}.parquet"
        return pl.read_parquet(path) if path.exists() else None

    def completions(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The greedy and sampled completions it generated."""
        return pl.read_parquet(self.directory / GREEDY_FILE), pl.read_parquet(self.directory / SAMPLED_FILE)


def read_published_eval(directory: Path) -> PublishedEval | None:
    """The evaluation published in `directory`, or None if there is none."""
    if not (directory / METRICS_FILE).exists():
        return None
    metrics = json.loads((directory / METRICS_FILE).read_text())["metrics"]
    return PublishedEval(directory, metrics, pl.read_parquet(directory / SCORES_FILE))


def deltas(metrics: dict[str, float], against: dict[str, dict[str, float]]) -> dict[str, float]:
    """`metrics` minus each other checkpoint's (`against`: name -> metrics), for every metric both have."""
    return {
        f"{DELTA_PREFIX}{name}/{key}": value - other[key]
        for name, other in against.items()
        for key, value in metrics.items()
        if key in other and key != "problems"
    }


def write_eval_artifact(
    staged: Path,
    *,
    title: str,
    result: EvalResult,
    metrics: dict[str, float],
    extras: ReportExtras,
    checkpoint: Path,
    eval_problems_fingerprint: str,
) -> tuple[str, dict[str, pl.DataFrame]]:
    """Write an evaluation into `staged` (see the module's list); the report's markdown with its figures inlined,
    and its tables by title."""
    tables = {BREAKDOWN_TABLE: result.breakdown} | extras.tables
    result.scores.write_parquet(staged / SCORES_FILE)
    result.breakdown.write_parquet(staged / "breakdown.parquet")
    result.greedy.write_parquet(staged / GREEDY_FILE)
    result.sampled.write_parquet(staged / SAMPLED_FILE)
    for section, table in tables.items():
        table.write_parquet(staged / f"{metadata_key(section)}.parquet")
    (staged / METRICS_FILE).write_text(
        json.dumps(
            {"metrics": metrics, "checkpoint": str(checkpoint), "eval_problems": eval_problems_fingerprint}, indent=2
        )
    )
    report = _report_markdown(title, extras.text, metrics, tables)
    return write_report(staged, REPORT_NAME, title, report, extras.figures), tables


def metadata_key(title: str) -> str:
    """A section title as a file stem and metadata key: 'By subject / level' -> 'by_subject_level'."""
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")


def _report_markdown(title: str, lead: str, metrics: dict[str, float], tables: dict[str, pl.DataFrame]) -> str:
    rows = pl.DataFrame(
        {"metric": list(metrics), "value": list(metrics.values())}, schema={"metric": pl.Utf8, "value": pl.Float64}
    )
    parts = [f"# {title}", ""] + ([lead, ""] if lead else []) + [markdown_table(rows)]
    for section, table in tables.items():
        if table.height:
            parts += ["", f"## {section}", "", markdown_table(table)]
    return "\n".join(parts) + "\n"
