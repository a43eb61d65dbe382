"""The run summary: every evaluated checkpoint's headline metrics, each round's pseudo-label audit,
and the share of the gold-label gain that self-training recovered (no Dagster here).

`python -m noisy_student_assets.summary` (run by `make run` after the rounds) prints it, writes it
to `<data lake>/run_summary.md` for pasting into a write-up, and says where the reports and the
MLflow store are.
"""

import json
import math
from pathlib import Path

import polars as pl

from noisy_student_assets.evaluation import METRICS_FILE
from noisy_student_assets.markdown import markdown_table
from noisy_student_assets.pseudo_labels import AUDIT_FILE
from resources.data_lake import default_root
from resources.tracking import TRACKING_DB_NAME

SUMMARY_FILE = "run_summary.md"
HEADLINE = ("greedy_accuracy", "maj@", "pass@", "format_rate", "mean_completion_tokens")
"""Metrics shown in the summary table, in this order; "maj@" and "pass@" stand for every k reported."""

FIXED_CHECKPOINTS = {"base_model": "base_model_eval", "labeled_rl": "labeled_rl_eval"}
GOLD_CONTROL = ("gold_label_rl", "gold_label_rl_eval")


_RANK = {"base_model": 0, "labeled_rl": 1, GOLD_CONTROL[0]: 3}
"""Rank of the named checkpoints in `checkpoint_order`; the rounds take rank 2."""


def checkpoint_order(name: str) -> tuple[int, str]:
    """Sort key: base model, labeled RL, the rounds in order, then the gold-label control."""
    return (_RANK.get(name, 2), name)


def eval_reports(lake: Path) -> list[tuple[str, Path]]:
    """(checkpoint name, report dir) of every published evaluation, in `checkpoint_order`."""
    rounds = sorted((lake / "eval_report").glob("round-*")) if (lake / "eval_report").is_dir() else []
    named = [(name, lake / asset) for name, asset in [*FIXED_CHECKPOINTS.items(), GOLD_CONTROL]]
    named += [(path.name, path) for path in rounds]
    return sorted(((name, path) for name, path in named if (path / METRICS_FILE).exists()), key=lambda item: checkpoint_order(item[0]))


def load_metrics(lake: Path) -> dict[str, dict[str, float]]:
    """Checkpoint name -> the metrics its eval report published, in `eval_reports` order."""
    return {name: json.loads((path / METRICS_FILE).read_text())["metrics"] for name, path in eval_reports(lake)}


def gold_gain_recovered(accuracy: float, labeled_rl: float, gold_label_rl: float) -> float:
    """(accuracy - labeled RL) / (gold-label control - labeled RL): the share of the gain that true
    labels give which pseudo-labels gave; NaN when true labels gave no gain to measure against."""
    gain = gold_label_rl - labeled_rl
    return (accuracy - labeled_rl) / gain if gain > 0 else math.nan


def gold_gain_shares(metrics: dict[str, dict[str, float]]) -> dict[str, float]:
    """Round name -> `gold_gain_recovered` of its greedy accuracy; empty unless both labeled RL and the
    gold-label control were evaluated."""
    if not {"labeled_rl", GOLD_CONTROL[0]} <= metrics.keys():
        return {}
    labeled, gold = metrics["labeled_rl"]["greedy_accuracy"], metrics[GOLD_CONTROL[0]]["greedy_accuracy"]
    return {
        name: gold_gain_recovered(values["greedy_accuracy"], labeled, gold)
        for name, values in metrics.items() if name.startswith("round-")
    }


def headline_metrics(metrics: dict[str, dict[str, float]]) -> list[str]:
    """The HEADLINE metrics any checkpoint reports, maj@k and pass@k in increasing k."""
    reported = {name for values in metrics.values() for name in values}
    columns = []
    for metric in HEADLINE:
        if metric.endswith("@"):
            columns += sorted((m for m in reported if m.startswith(metric)), key=lambda m: int(m.removeprefix(metric)))
        elif metric in reported:
            columns.append(metric)
    return columns


def accuracy_table(metrics: dict[str, dict[str, float]], seed: int | str = 0) -> pl.DataFrame:
    """One row per checkpoint: checkpoint, seed and every headline metric (null where it lacks one)."""
    columns = headline_metrics(metrics)
    return pl.DataFrame(
        [{"checkpoint": name, "seed": str(seed)} | {m: values.get(m) for m in columns} for name, values in metrics.items()],
        schema={"checkpoint": pl.Utf8, "seed": pl.Utf8} | {m: pl.Float64 for m in columns},
    )


def label_audits(lake: Path) -> pl.DataFrame:
    """One row per round with pseudo-labels: tau, coverage, kept and overall label accuracy, teacher pass@1."""
    directory = lake / "pseudo_labels"
    rows = [
        {"round": path.parent.name} | json.loads(path.read_text())
        for path in sorted(directory.glob(f"round-*/{AUDIT_FILE}"))
    ] if directory.is_dir() else []
    columns = ["round", "tau", "coverage", "kept", "mean_agreement", "kept_label_accuracy", "all_label_accuracy", "teacher_pass_at_1"]
    return pl.DataFrame(rows).select(columns) if rows else pl.DataFrame(schema=columns)


def summary_markdown(metrics: dict[str, dict[str, float]], audits: pl.DataFrame) -> str:
    """The run summary as markdown tables."""
    lines = ["## Accuracy per checkpoint", "", markdown_table(accuracy_table(metrics).drop("seed"))]
    if {"labeled_rl", GOLD_CONTROL[0]} <= metrics.keys():
        labeled, gold = metrics["labeled_rl"]["greedy_accuracy"], metrics[GOLD_CONTROL[0]]["greedy_accuracy"]
        recovered = [
            {"round": name, "greedy_accuracy": metrics[name]["greedy_accuracy"], "share_of_gold_gain": share}
            for name, share in gold_gain_shares(metrics).items()
        ]
        lines += [
            "", f"## Gold-label gain recovered (labeled RL {labeled:.3f}, gold-label control {gold:.3f})", "",
            markdown_table(pl.DataFrame(recovered)) if recovered else "No rounds evaluated yet.",
        ]
    if audits.height:
        lines += ["", "## Pseudo-labels (audited against the hidden gold)", "", markdown_table(audits)]
    return "\n".join(lines) + "\n"


def main() -> None:
    lake = Path(default_root())
    print(f"\nData lake: {lake}")
    reports = eval_reports(lake)
    if not reports:
        print("No eval reports yet.")
        return
    summary = summary_markdown(load_metrics(lake), label_audits(lake))
    (lake / SUMMARY_FILE).write_text(f"# noisy-student run summary\n\n{summary}")
    print(summary)
    print(f"Run summary (markdown): {lake / SUMMARY_FILE}")
    print("Eval reports:")
    for name, path in reports:
        print(f"  {name:<14} {path / 'report.md'}")
    print(f"\nMLflow store: sqlite:///{lake / TRACKING_DB_NAME}")
    print(f"  compare runs: mlflow ui --backend-store-uri sqlite:///{lake / TRACKING_DB_NAME}")


if __name__ == "__main__":
    main()
