"""Figures of a self-training run as PNG bytes (matplotlib, no Dagster here).

Each function takes plain tables and returns the PNG, so the eval report can both store the file
and embed it in Dagster metadata, and MLflow can log it as an artifact.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import polars as pl

_DPI = 100


def _figure(width: float = 6.4, height: float = 3.6):
    import matplotlib

    matplotlib.use("Agg")  # no display: render to memory only
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height), dpi=_DPI)


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def accuracy_by_checkpoint(accuracy: pl.DataFrame, metric: str = "greedy_accuracy") -> bytes:
    """Bars of `metric` per checkpoint (in the table's order of first appearance), with one dot per
    seed and error bars of one standard deviation when a checkpoint has several seeds.

    `accuracy` has the columns `checkpoint`, `seed` and `metric`.
    """
    stats = (
        accuracy.group_by("checkpoint", maintain_order=True)
        .agg(pl.col(metric).mean().alias("mean"), pl.col(metric).std().alias("std"), pl.col(metric).alias("values"))
        .with_columns(pl.col("std").fill_null(0.0).fill_nan(0.0))
    )
    fig, ax = _figure()
    positions = range(stats.height)
    several_seeds = bool((stats["values"].list.len() > 1).any())
    ax.bar(
        positions,
        stats["mean"],
        yerr=stats["std"] if several_seeds else None,
        capsize=4,
        color="#4c72b0",
        alpha=0.8,
    )
    for position, values in zip(positions, stats["values"], strict=True):
        ax.scatter([position] * len(values), values, color="black", s=10, zorder=3)
    for position, mean, top in zip(positions, stats["mean"], stats["values"].list.max(), strict=True):
        ax.annotate(f"{mean:.3f}", (position, max(mean, top)), ha="center", va="bottom", fontsize=8, xytext=(0, 6), textcoords="offset points")
    seeds = accuracy["seed"].n_unique()
    ax.set_xticks(list(positions), stats["checkpoint"].to_list(), rotation=20, ha="right")
    ax.set_ylabel(metric)
    ax.set_ylim(0, min(1.0, max(stats["mean"].max() + stats["std"].max(), 0.05) * 1.25))
    ax.set_title(f"{metric} per checkpoint" + (f" (mean ± sd over {seeds} seeds)" if several_seeds else ""))
    return _png(fig)


def agreement_histogram(agreement: Sequence[float], tau: float, k: int) -> bytes:
    """How often the teacher's K samples agreed with their majority, with tau marked."""
    fig, ax = _figure()
    edges = [(i - 0.5) / k for i in range(k + 2)]  # one bin per possible count 0..k
    ax.hist(list(agreement), bins=edges, color="#55a868", edgecolor="white")
    ax.axvline(tau, color="#c44e52", linestyle="--", label=f"tau = {tau:g}")
    ax.set_xlim(-0.5 / k, 1 + 0.5 / k)
    ax.set_xlabel(f"agreement (majority count / K, K = {k})")
    ax.set_ylabel("problems")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title("Agreement of the teacher's samples")
    ax.legend()
    return _png(fig)


def label_accuracy_vs_agreement(buckets: pl.DataFrame) -> bytes:
    """Pseudo-label accuracy against the hidden gold per agreement bucket, each bar labeled with
    its problem count. `buckets` has the columns `bucket`, `problems` and `label_accuracy`."""
    fig, ax = _figure()
    positions = range(buckets.height)
    accuracy = buckets["label_accuracy"].fill_null(0.0)
    ax.bar(positions, accuracy, color="#8172b2")
    for position, value, problems in zip(positions, accuracy, buckets["problems"], strict=True):
        ax.annotate(f"n={problems}", (position, value), ha="center", va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points")
    ax.set_xticks(list(positions), buckets["bucket"].to_list())
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("agreement bucket")
    ax.set_ylabel("label accuracy vs hidden gold")
    ax.set_title("Pseudo-label calibration")
    return _png(fig)
