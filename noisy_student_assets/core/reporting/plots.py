"""Figures of a self-training run as PNG bytes (matplotlib, no Dagster here).

Each function takes plain tables and returns the PNG, so the eval report can both store the file
and embed it in Dagster metadata, and MLflow can log it as an artifact.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import polars as pl

from noisy_student_assets.core import layout

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
        ax.annotate(
            f"n={problems}",
            (position, value),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 3),
            textcoords="offset points",
        )
    ax.set_xticks(list(positions), buckets["bucket"].to_list())
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("agreement bucket")
    ax.set_ylabel("label accuracy vs hidden gold")
    ax.set_title("Pseudo-label calibration")
    return _png(fig)


_ROLE_COLORS = {
    "student": "#4c72b0",
    "labeled_only": "#dd8452",
    "gold_label": "#55a868",
    "random_label": "#c44e52",
    "dose_label": "#8172b2",
    "kept_gold_label": "#937860",
}
_GROUP_STYLES = ("-", "--", ":", "-.")


def ran_chains(chains: pl.DataFrame) -> pl.DataFrame:
    """The rows of the chains a group ran: the summary gives every chain round 0 (labeled RL, where each starts), so a
    control with no later round is one the arm never trained, and is left out of the figure and its legend."""
    ran = chains.filter((pl.col("round") > 0) | (pl.col("checkpoint") == layout.STUDENT_ROLE))
    ran = ran.select("group", "checkpoint")
    return chains.join(ran.unique(), on=["group", "checkpoint"], how="semi", maintain_order="left")


def accuracy_by_round(accuracy: pl.DataFrame, metric: str = "greedy_accuracy") -> bytes:
    """`metric` per round for each chain (the student and each control; round 0 is labeled RL), the mean
    over seeds with one standard deviation as error bars; one line style per arm group when the table has
    a `group` column, and the base model as a dotted line when it has a `base_model` row.

    `accuracy` has the columns `round`, `checkpoint` (student, labeled_only, gold_label, random_label or
    base_model) and `metric`.
    """
    fig, ax = _figure(7.2, 4.0)
    table = accuracy if "group" in accuracy.columns else accuracy.with_columns(pl.lit("").alias("group"))
    base = table.filter(pl.col("checkpoint") == "base_model")[metric].drop_nulls()
    if base.len():
        ax.axhline(base.mean(), color="grey", linestyle=":", label=f"base model ({base.mean():.3f})")
    chains = ran_chains(table.filter(pl.col("checkpoint") != "base_model"))
    groups = chains["group"].unique(maintain_order=True).to_list()
    for group_index, group in enumerate(groups):
        for role in chains.filter(pl.col("group") == group)["checkpoint"].unique(maintain_order=True).to_list():
            points = (
                chains.filter((pl.col("group") == group) & (pl.col("checkpoint") == role))
                .group_by("round")
                .agg(pl.col(metric).mean().alias("mean"), pl.col(metric).std().fill_null(0.0).alias("std"))
                .sort("round")
            )
            ax.errorbar(
                points["round"],
                points["mean"],
                yerr=points["std"],
                capsize=3,
                marker="o",
                color=_ROLE_COLORS.get(role, "black"),
                linestyle=_GROUP_STYLES[group_index % len(_GROUP_STYLES)],
                label=f"{role} {group}".strip(),
            )
    rounds = chains["round"].unique().sort().to_list()
    ax.set_xticks(rounds, ["labeled RL" if r == 0 else f"round {r}" for r in rounds])
    ax.set_ylabel(metric)
    ax.set_title(
        f"{metric} by round"
        + (" (mean ± sd over seeds)" if chains.group_by("group", "checkpoint", "round").len()["len"].max() > 1 else "")
    )
    ax.legend(fontsize=7, loc="best")
    return _png(fig)


def label_frontier(curve: pl.DataFrame, operating_points: pl.DataFrame, oracle: str) -> bytes:
    """Kept-label accuracy against the hidden gold by coverage, one line per label source and the oracle's ceiling
    dashed, each source's operating point (its tau) marked. `curve`: source, coverage, label_accuracy;
    `operating_points`: source, "at tau: coverage", "at tau: label_accuracy"."""
    fig, ax = _figure(6.4, 4.0)
    for index, source in enumerate(curve["source"].unique(maintain_order=True).to_list()):
        points = curve.filter(pl.col("source") == source)
        color = "grey" if source == oracle else f"C{index}"
        ax.plot(
            points["coverage"],
            points["label_accuracy"],
            color=color,
            linestyle="--" if source == oracle else "-",
            label=source,
        )
        point = operating_points.filter(pl.col("source") == source)
        if point.height and point["at tau: label_accuracy"][0] is not None:
            ax.plot(point["at tau: coverage"][0], point["at tau: label_accuracy"][0], marker="o", color=color)
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("coverage (share of unlabeled problems kept, most confident first)")
    ax.set_ylabel("kept-label accuracy vs hidden gold")
    ax.set_title("Label-quality frontier (dot: the operating point at tau)")
    ax.legend(fontsize=8, loc="lower left")
    return _png(fig)


def grpo_groups(completions: pl.DataFrame, reward: str = "answer_reward") -> bytes:
    """One GRPO step's advantages: a bar per completion, grouped by prompt, green where `reward` paid it, red where it
    did not, grey where it was ungraded; each group labelled with its mean reward. `completions`: question, `reward`,
    advantage (`training.grpo.logged_completions`)."""
    from matplotlib.patches import Patch

    fig, ax = _figure(7.2, 4.0)
    colors = {"rewarded": "#55a868", "not rewarded": "#c44e52", "ungraded": "grey"}
    start, ticks, tick_labels = 0, [], []
    for question in completions["question"].unique(maintain_order=True).to_list():
        group = completions.filter(pl.col("question") == question)
        shades = [
            colors["ungraded"] if value is None else colors["rewarded" if value > 0 else "not rewarded"]
            for value in group[reward]
        ]
        positions, advantages = list(range(start, start + group.height)), group["advantage"].fill_null(0.0)
        ax.bar(positions, advantages, color=shades)
        ax.scatter(positions, advantages, color=shades, s=14, zorder=3)  # a completion of advantage 0 has no bar
        ticks.append(start + (group.height - 1) / 2)
        mean = group[reward].mean()
        tick_labels.append(
            f"{question.splitlines()[0][:32]}\nmean {reward} {'ungraded' if mean is None else f'{mean:.2f}'}"
        )
        start += group.height + 1  # a gap between groups
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(ticks, tick_labels, fontsize=7)
    ax.set_ylabel("advantage")
    ax.set_title("One GRPO step: each completion's advantage within its group")
    ax.legend(handles=[Patch(color=color, label=label) for label, color in colors.items()], fontsize=7, loc="best")
    return _png(fig)


def break_even(table: pl.DataFrame) -> bytes:
    """Each line's held-out accuracy minus its labeled-only control's against the accuracy of the labels it trained
    on, with its interval: where pseudo-labels of a given accuracy break even. `table`: `summary.BREAK_EVEN_SCHEMA`'s
    `group`, `line`, `seeds`, `label_accuracy`, `estimate`, `low` and `high` (one round). A student is labeled by its
    group; the controls, which arms of one seed share, once per place."""
    fig, ax = _figure(7.2, 4.4)
    ax.axhline(0.0, color="grey", linestyle=":", label="labeled-only (no gain)")
    shown = table.unique(["line", "label_accuracy", "estimate"], maintain_order=True)
    named_at: dict[tuple[float, float], int] = {}  # names already written at a place: the next goes above them
    for row in shown.iter_rows(named=True):
        name = f"student {row['group']}" if row["line"] == layout.STUDENT_ROLE else row["line"]
        place = (round(row["label_accuracy"], 2), round(row["estimate"], 2))
        named_at[place] = named_at.get(place, -1) + 1
        ax.errorbar(
            [row["label_accuracy"]],
            [row["estimate"]],
            yerr=[[row["estimate"] - row["low"]], [row["high"] - row["estimate"]]],
            capsize=3,
            marker="o" if row["line"] == layout.STUDENT_ROLE else "s",
            color=_ROLE_COLORS.get(row["line"], "black"),
            linestyle="none",
        )
        ax.annotate(
            name,
            (row["label_accuracy"], row["estimate"]),
            fontsize=7,
            xytext=(4, 3 + 8 * named_at[place]),
            textcoords="offset points",
        )
    ax.set_xlim(-0.05, 1.1)
    ax.set_xlabel("accuracy of the labels trained on (vs the hidden gold)")
    ax.set_ylabel("greedy accuracy minus labeled-only")
    seeds = int(table["seeds"].max()) if table.height else 0
    ax.set_title(
        "Break-even of pseudo-labels" + (" (one seed: a pilot, intervals over problems alone)" if seeds == 1 else "")
    )
    ax.legend(fontsize=7, loc="best")
    return _png(fig)
