"""The headroom table: per task, what a better judge of the samples can win, and whether better labels can
matter at all (no Dagster here).

- label headroom: the labeled-RL teacher's greedy accuracy on the validation split, and over its K samples
  of the unlabeled problems (the round's audit against the hidden gold) the majority's accuracy (maj@K) and
  the oracle's (pass@K). pass@K minus maj@K is what a label source can win over the plain vote;
- data headroom: the round's gold-label control minus its labeled-only control on the held-out set, paired by
  problem and pooled over the seeds (`verdict.paired_difference`), with the smallest true effect its interval detects
  80% of the time (its mde). Where perfect labels do not beat the labels alone, no label source can make a better
  student; an interval that takes no side shows no headroom only within the experiment's equivalence margin, and
  otherwise could have missed one up to its mde.

`experiments/headroom.yaml`'s arms each name their task (`experiments/tasks/`) and seed; the grid runs them in one
lake, and the table groups them by task (`python -m noisy_student_assets.headroom`).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import Arm
from noisy_student_assets.core.experiments.passes import arm_passes
from noisy_student_assets.core.pseudo_labels.labels import AUDIT_FILE, PublishedAudit
from noisy_student_assets.core.reporting import verdict
from noisy_student_assets.core.reporting.eval_report import PublishedEval
from noisy_student_assets.core.reporting.summary import read_evaluation
from noisy_student_assets.core.training.grpo import saturation_step, step_rewards

ROUND = 1


CONTROLS = (layout.LABELED_ONLY, layout.GOLD_LABEL)


def control_evals(lake: Path, arms: list[Arm]) -> dict[str, dict[str, PublishedEval | None]]:
    """Per arm, its round's labeled-only and gold-label evaluations (None where not made yet)."""
    return {
        arm.name: {
            role: read_evaluation(lake, layout.round_asset(ROUND, layout.eval_of(role)), arm.name) for role in CONTROLS
        }
        for arm in arms
    }


def seed_rows(lake: Path, arms: list[Arm], evals: dict[str, dict[str, PublishedEval | None]]) -> pl.DataFrame:
    """One row per arm (seed) that has its labeled-RL validation and its round's audit: the label headroom's parts,
    the two controls' held-out greedy accuracy (`evals`: `control_evals`) and the step at which the labeled-only
    control's training reward saturated (`grpo.saturation_step`; null where it did not or was not logged)."""
    rows = []
    for arm in arms:
        validation = read_evaluation(lake, layout.LABELED_RL_VALIDATION, arm.name)
        labels_dir = layout.artifact_dir(lake, layout.round_asset(ROUND, layout.PSEUDO_LABELS), arm.name)
        if validation is None or not (labels_dir / AUDIT_FILE).exists():
            continue
        audit = PublishedAudit.read(labels_dir)
        controls = evals[arm.name]
        rewards = step_rewards(
            layout.artifact_dir(
                lake, layout.round_asset(ROUND, layout.control_checkpoint(layout.LABELED_ONLY)), arm.name
            )
        )
        rows.append(
            {
                "arm": arm.name,
                "seed": arm.spec.seed,
                "teacher_validation_greedy": validation.metrics["greedy_accuracy"],
                "maj_at_k": audit.teacher_maj_at_k,
                "pass_at_k": audit.teacher_pass_at_k,
                "labeled_only": controls[layout.LABELED_ONLY].metrics["greedy_accuracy"]
                if controls[layout.LABELED_ONLY]
                else None,
                "gold_label": controls[layout.GOLD_LABEL].metrics["greedy_accuracy"]
                if controls[layout.GOLD_LABEL]
                else None,
                "labeled_only_steps": len(rewards) if rewards else None,
                "labeled_only_saturated_at": saturation_step(rewards) if rewards else None,
            }
        )
    return pl.DataFrame(rows, schema=SEED_SCHEMA)


SEED_SCHEMA = {
    "arm": pl.Utf8,
    "seed": pl.Int64,
    "teacher_validation_greedy": pl.Float64,
    "maj_at_k": pl.Float64,
    "pass_at_k": pl.Float64,
    "labeled_only": pl.Float64,
    "gold_label": pl.Float64,
    "labeled_only_steps": pl.Int64,
    "labeled_only_saturated_at": pl.Int64,
}
MEANS = ("teacher_validation_greedy", "maj_at_k", "pass_at_k", "labeled_only", "gold_label")
"""The seed rows' columns the table averages over seeds."""


def saturated_seeds(seeds: pl.DataFrame) -> str:
    """How many of `seeds` (`seed_rows`) saw the labeled-only control's reward saturate, and at which steps: '2 of 5
    (steps 8, 12 of 24)'; 'not logged' where no seed logged its rewards."""
    logged = seeds.filter(pl.col("labeled_only_steps").is_not_null())
    if not logged.height:
        return "not logged"
    steps = sorted(logged["labeled_only_saturated_at"].drop_nulls().to_list())
    at = f" (steps {', '.join(map(str, steps))} of {logged['labeled_only_steps'].max()})" if steps else ""
    return f"{len(steps)} of {logged.height}{at}"


def regime(arm: Arm) -> str:
    """What an arm sets besides its task and seed: 'n_labeled=4', or 'defaults'."""
    spec = arm.own.model_copy(update={"seed": None, "task": None}).model_dump(exclude_none=True)
    return " ".join(f"{name}={value}" for name, value in spec.items()) or "defaults"


def data_headroom(
    evals: dict[str, dict[str, PublishedEval | None]], margin: float | None = None
) -> verdict.Difference | None:
    """Gold-label minus labeled-only on the held-out set, paired by problem, over the arms that have both
    (`evals`: `control_evals`; `margin`: the experiment's equivalence margin)."""
    pairs = [
        (controls[layout.GOLD_LABEL].scores, controls[layout.LABELED_ONLY].scores)
        for controls in evals.values()
        if controls[layout.GOLD_LABEL] and controls[layout.LABELED_ONLY]
    ]
    if not pairs:
        return None
    treatment, control = verdict.paired_scores(pairs)
    return verdict.paired_difference(
        treatment, control, treatment_name="gold-label", control_name="labeled-only", margin=margin
    )


def task_row(task: str, lake: Path, arms: list[Arm]) -> dict:
    """The line of `task` in one regime (its seeds, `arms`) in the table: the regime and its runs' passes over their
    problems (`passes.arm_passes`), seed means of the label headroom, the data headroom with its interval, and how
    many seeds' labeled-only control saturated."""
    evals = control_evals(lake, arms)
    seeds = seed_rows(lake, arms, evals)
    difference = data_headroom(evals, arms[0].equivalence_margin)
    means = seeds.select(pl.col(MEANS).mean()).row(0, named=True) if seeds.height else dict.fromkeys(MEANS)
    passes = arm_passes(arms[0])
    return {
        "task": task,
        "regime": regime(arms[0]),
        "seeds": seeds.height,
        "teacher_validation_greedy": means["teacher_validation_greedy"],
        "maj_at_k": means["maj_at_k"],
        "pass_at_k": means["pass_at_k"],
        "label_headroom": None if means["pass_at_k"] is None else means["pass_at_k"] - means["maj_at_k"],
        "labeled_only_passes": passes[layout.LABELED_ONLY],
        "gold_label_passes": passes[layout.GOLD_LABEL],
        "labeled_only": means["labeled_only"],
        "gold_label": means["gold_label"],
        "data_headroom": difference.estimate if difference else None,
        "data_headroom_low": difference.low if difference else None,
        "data_headroom_high": difference.high if difference else None,
        "data_headroom_mde": difference.mde if difference else None,
        "data_headroom_seeds": difference.seeds if difference else 0,
        "outcome": difference.outcome if difference else "not run",
        "labeled_only_saturated": saturated_seeds(seeds),
    }


def headroom_table(lake: Path, arms: list[Arm]) -> pl.DataFrame:
    """One line per task and regime that `arms` name (`task_row`: arms that differ only by seed), in the order they
    first appear."""
    groups: dict[tuple[str, str], list[Arm]] = {}
    for arm in arms:
        groups.setdefault((arm.spec.task, regime(arm)), []).append(arm)
    return pl.DataFrame([task_row(task, lake, members) for (task, _), members in groups.items()])


def grid_task(table: pl.DataFrame) -> str | None:
    """The task the label-source grid takes: of the tasks where gold labels beat labeled-only (the interval over
    seeds excludes 0, on 3 seeds or more), the one with the most label headroom; None where no task has data
    headroom."""
    candidates = table.filter((pl.col("outcome") == "better") & (pl.col("data_headroom_seeds") >= 3))
    candidates = candidates.sort("label_headroom", descending=True, nulls_last=True)
    return candidates["task"][0] if candidates.height else None


def headroom_verdict(table: pl.DataFrame) -> str:
    """The table's closing line: the label-source grid's task (`grid_task`), else what each task's data headroom
    says, an inconclusive one with the effect it could have missed."""
    chosen = grid_task(table)
    if chosen:
        return f"The label-source grid's task: {chosen}"
    verdicts = [
        f"{task}{'' if regime == 'defaults' else f' {regime}'}: "
        + (f"{verdict.wording(outcome, mde)} ({seeds} seeds)" if mde is not None else outcome)
        for task, regime, outcome, mde, seeds in table.select(
            "task", "regime", "outcome", "data_headroom_mde", "data_headroom_seeds"
        ).iter_rows()
    ]
    return "No task shows data headroom (gold labels beating labeled-only on 3 seeds); " + "; ".join(verdicts) + "."
