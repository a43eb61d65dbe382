"""The findings table (no Dagster here): each question the committed results answer, with its effect, its interval,
the effect it could have missed (MDE at 80% power), its seeds, its verdict by the one rule (`verdict.wording`) and the
command that prints those figures. docs/results.md opens with it and the README's Results show it, both copied from
`python -m noisy_student_assets.findings --write` (a test fails when either differs from what the command prints).

The questions are the experiment files' (each file's `findings:`, `arms.FindingQuestion`), asked of
`results/` in the order of their ranks:
- `data_headroom`: gold labels minus the labels alone per task and regime (`headroom.data_headroom`);
- `students`: each arm group's student minus its labeled-only control at the experiment's last round (`summary`);
- `label_sources`: each label source's kept-label accuracy minus the head count's at full coverage
  (`summary.sources_against`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import (
    EXPERIMENT_SUFFIX,
    Arm,
    Experiment,
    FindingQuestion,
    load_experiments,
)
from noisy_student_assets.core.lake_reader import ArmLake
from noisy_student_assets.core.reporting import test_time, verdict
from noisy_student_assets.core.reporting.headroom import headroom_table, line_name
from noisy_student_assets.core.reporting.markdown import with_block
from noisy_student_assets.core.reporting.summary import collect, group_label, sources_against

BEGIN, END = "<!-- findings: begin -->", "<!-- findings: end -->"
"""The markers around the findings table in README.md and docs/results.md."""
HEADLINE_BEGIN, HEADLINE_END = "<!-- headline: begin -->", "<!-- headline: end -->"
"""The markers around the README's headline (`headline`), under its two commands."""
DIRECT_EFFECT_COVERAGE = "at 100%"
LABEL_SOURCES = ("confidence", "verifier")


@dataclass(frozen=True)
class Finding:
    question: str
    estimate: float
    low: float | None
    high: float | None
    mde: float | None
    seeds: int
    outcome: str
    command: str

    @classmethod
    def of(cls, question: str, row: dict, command: str, estimate: str = "estimate") -> Finding:
        """A finding from a row of the summary's comparisons: its estimate, interval, mde, seeds and outcome."""
        return cls(question, row[estimate], row["low"], row["high"], row["mde"], row["seeds"], row["outcome"], command)

    @property
    def verdict(self) -> str:
        return verdict.wording(self.outcome, self.mde) if self.mde is not None else self.outcome


def _command(experiment: Experiment, question: FindingQuestion, module: str = "summary") -> str:
    return (
        question.command
        or f"python -m noisy_student_assets.{module} --experiment experiments/{experiment.name}{EXPERIMENT_SUFFIX}"
        " --lake results"
    )


def findings(results: Path, experiments_dir: Path) -> list[Finding]:
    """The findings of the results directory `results`: the questions the experiment files in `experiments_dir`
    declare (`Experiment.findings`), in the order of their ranks."""
    asked = sorted(
        (
            (question, experiment)
            for experiment in load_experiments(experiments_dir).values()
            for question in experiment.findings
        ),
        key=lambda pair: pair[0].rank,
    )
    answer = {"data_headroom": headroom_findings, "students": student_findings, "label_sources": source_findings}
    return [
        finding for question, experiment in asked for finding in answer[question.ask](results, experiment, question)
    ]


def headroom_findings(results: Path, experiment: Experiment, question: FindingQuestion) -> list[Finding]:
    """Gold labels minus the labels alone (`headroom.data_headroom`) per task and regime of the experiment."""
    return [
        Finding(
            f"Gold labels beat the labels alone (data headroom), {line_name(row['task'], row['regime'])}"
            + (
                f" (labeled-only: {row['labeled_only_passes']:g} passes over its labels)"
                if question.labeled_only_passes
                else ""
            ),
            row["data_headroom"],
            row["data_headroom_low"],
            row["data_headroom_high"],
            row["data_headroom_mde"],
            row["data_headroom_seeds"],
            row["outcome"],
            _command(experiment, question, module="headroom"),
        )
        for row in headroom_table(results, experiment.all_arms()).iter_rows(named=True)
        if row["data_headroom"] is not None
    ]


def source_findings(results: Path, experiment: Experiment, question: FindingQuestion) -> list[Finding]:
    """The label sources' direct effect on the experiment's task: each source's kept-label accuracy minus the head
    count's with every problem labeled (`summary.sources_against`)."""
    collected = collect(results, experiment.all_arms(), experiment.max_rounds)
    sources = sources_against(collected.sources, collected.curves, margins=collected.margins)
    if not sources.height:
        return []
    task = experiment.all_arms()[0].spec.task
    sources = sources.filter(pl.col("coverage") == DIRECT_EFFECT_COVERAGE, pl.col("source").is_in(LABEL_SOURCES))
    return [
        Finding.of(
            f"{row['source'].capitalize()} labels are right more often than the head count's, all problems "
            f"labeled, {task}",
            row,
            _command(experiment, question),
            estimate="minus majority",
        )
        for row in sources.iter_rows(named=True)
    ]


def student_findings(results: Path, experiment: Experiment, question: FindingQuestion) -> list[Finding]:
    """Each arm group's student minus its labeled-only control over its seeds, at the experiment's last round, on
    every held-out problem; `question.group` names the group's task (and regime) from one of its arms' fields. The
    seeds whose verifier failed `verifier_informative` have no student: the question names them."""
    arm_of = {group_label(arm): arm for arm in experiment.all_arms()}
    collected = collect(results, experiment.all_arms(), experiment.max_rounds)
    differences = collected.differences
    if differences.is_empty():  # none of its arms in the results yet
        return []
    failed_seeds = dict(collected.failed.group_by("group").agg(pl.col("seed").sort()).iter_rows())

    def unmeasured(group: str) -> str:
        seeds = failed_seeds.get(group)
        if not seeds:
            return ""
        return (
            f" (no student on seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}: its verifier was not informative)"
        )

    last = differences.filter(
        (pl.col("control") == layout.LABELED_ONLY) & (pl.col("eval_set") == "all"),
        pl.col("round") == pl.col("round").max().over("group"),
    )
    return [
        Finding.of(
            f"The {arm_of[row['group']].label_source}-label student{_variant(arm_of[row['group']])} beats "
            f"labeled-only (round {row['round']}), "
            + question.group.format(**arm_of[row["group"]].spec.model_dump())
            + unmeasured(row["group"]),
            row,
            _command(experiment, question),
        )
        for row in last.iter_rows(named=True)
    ]


def _variant(arm: Arm) -> str:
    """What else than its label source and seed the arm's student sets (its training options: ' (reward=...)'), or
    nothing; the task and regime are the question's `group`. The dose control's rho is no setting of the student."""
    own = group_label(arm, besides=("seed", "split_seed", "task", "n_labeled", "label_source", "dose_rho"))
    return "" if own == "defaults" else f" ({own})"


def findings_markdown(rows: list[Finding]) -> str:
    """The findings as a markdown table, between the markers that `with_findings` replaces."""

    def interval(row: Finding) -> str:
        return "n/a" if row.low is None else f"{row.low:+.3f} to {row.high:+.3f}"

    lines = [
        BEGIN,
        "| question | effect | 95% interval | MDE (80% power) | seeds | verdict | printed by |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {row.question} | {row.estimate:+.3f} | {interval(row)} | "
        f"{'n/a' if row.mde is None else f'{row.mde:.3f}'} | {row.seeds} | {row.verdict} | `{row.command}` |"
        for row in rows
    ]
    return "\n".join([*lines, END])


def headline(results: Path, experiments_dir: Path) -> str:
    """What the experiment that sets `headline` (`make run`'s) found, in one sentence with its markers: its teacher
    against the base model, then its last round's student against the labeled-only control, with the difference's
    interval and the verdict's words."""
    (experiment,) = [found for found in load_experiments(experiments_dir).values() if found.headline]
    arms = [arm for arm in experiment.all_arms() if ArmLake(results, arm.name).has_results()]
    file = f"`experiments/{experiment.name}{EXPERIMENT_SUFFIX}`"
    if not arms:
        return f"{HEADLINE_BEGIN}\n{file} has no results in `results/` yet.\n{HEADLINE_END}"
    found = collect(results, arms, experiment.max_rounds)
    means = found.accuracy.group_by("round", "checkpoint").agg(pl.col("greedy_accuracy").mean())

    def accuracy(number: int, checkpoint: str) -> float:
        return means.filter(pl.col("round") == number, pl.col("checkpoint") == checkpoint)["greedy_accuracy"].item()

    last = (
        found.differences.filter(pl.col("control") == layout.LABELED_ONLY, pl.col("eval_set") == test_time.ALL_EVAL)
        .sort("round")
        .row(-1, named=True)
    )
    number, seeds = last["round"], last["seeds"]
    return (
        f"{HEADLINE_BEGIN}\n**What {file} found** ({seeds} seed{'s' if seeds != 1 else ''}, from `results/`): labeled "
        f"RL reaches {accuracy(0, layout.STUDENT_ROLE):.3f} held-out accuracy from the base model's "
        f"{accuracy(0, layout.BASE_MODEL):.3f}; round {number}'s student scores "
        f"{accuracy(number, layout.STUDENT_ROLE):.3f} against {accuracy(number, layout.LABELED_ONLY):.3f} for its "
        f"compute-matched labeled-only control ({last['estimate']:+.3f}, 95% interval {last['low']:+.3f} to "
        f"{last['high']:+.3f} over {'problems' if seeds == 1 else 'seeds and problems'}): "
        f"{Finding.of('', last, '').verdict}.\n{HEADLINE_END}"
    )


def with_findings(page: str, table: str) -> str:
    """`page` with its findings table replaced by `table` (`findings_markdown`, markers included)."""
    return with_block(page, table, BEGIN, END)


def findings_block(page: str) -> str:
    """The findings table `page` holds, markers included."""
    return BEGIN + page.split(BEGIN, 1)[1].split(END, 1)[0] + END
