"""The headroom table: per task and regime (what its arms set besides task and seed), what a better judge of the
samples can win, and whether better labels can matter at all (no Dagster here).

- label headroom: the labeled-RL teacher's greedy accuracy on the validation split, and over its K samples
  of the unlabeled problems (the round's audit against the hidden gold) the majority's accuracy (maj@K) and
  the oracle's (pass@K). pass@K minus maj@K is what a label source can win over the plain vote;
- data headroom: the round's gold-label control minus its labeled-only control on the held-out set, paired by
  problem and pooled over the seeds (`verdict.paired_difference`), with the smallest true effect its interval detects
  80% of the time (its mde). Where perfect labels do not beat the labels alone, no label source can make a better
  student; an interval that takes no side shows no headroom only within the experiment's equivalence margin, and
  otherwise could have missed one up to its mde;
- the passes of each run over its problems (`passes.arm_passes`), and the step at which each seed's labeled-only
  control's training reward saturated: extra data can only matter once training outruns the labels.

`experiments/headroom.yaml`'s arms each name their task (`experiments/tasks/`) and seed, and
`experiments/passes.yaml`'s vary the labeled set's size; the grid runs them in one lake, and the table groups them
by task and regime (`python -m noisy_student_assets.headroom [--experiment ...]`).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import Arm
from noisy_student_assets.core.experiments.passes import LABELED_RL_RUN, arm_passes
from noisy_student_assets.core.lake_reader import ArmLake
from noisy_student_assets.core.reporting import verdict
from noisy_student_assets.core.reporting.eval_report import PublishedEval
from noisy_student_assets.core.reporting.summary import group_label, seed_label
from noisy_student_assets.core.training.grpo import saturation_step

ROUND = 1


CONTROLS = (layout.LABELED_ONLY, layout.GOLD_LABEL)


def control_evals(lake: Path, arms: list[Arm]) -> dict[str, dict[str, PublishedEval | None]]:
    """Per arm, its round's labeled-only and gold-label evaluations (None where not made yet)."""
    return {
        arm.name: {role: ArmLake(lake, arm.name).round_evaluation(ROUND, role) for role in CONTROLS} for arm in arms
    }


def seed_rows(lake: Path, arms: list[Arm], evals: dict[str, dict[str, PublishedEval | None]]) -> pl.DataFrame:
    """One row per arm (seed) with anything to show: the label headroom's parts (its labeled-RL validation and its
    round's audit, null where not made), the two controls' held-out greedy accuracy (`evals`: `control_evals`) and
    the step at which the labeled-only control's training reward saturated (`grpo.saturation_step`; null where it did
    not, or its checkpoint logged no rewards)."""
    rows = []
    for arm in arms:
        arm_lake = ArmLake(lake, arm.name)
        validation, labels = arm_lake.evaluation(layout.LABELED_RL_VALIDATION), arm_lake.labels(ROUND)
        audit = labels.audit if labels else None
        controls = evals[arm.name]
        if validation is None and audit is None and not any(controls.values()):
            continue
        control = arm_lake.checkpoint(layout.round_asset(ROUND, layout.control_checkpoint(layout.LABELED_ONLY)))
        rewards = control.step_rewards if control else None
        rows.append(
            {
                "arm": arm.name,
                "seed": seed_label(arm),
                "teacher_validation_greedy": validation.metrics["greedy_accuracy"] if validation else None,
                "maj_at_k": audit.teacher_maj_at_k if audit else None,
                "pass_at_k": audit.teacher_pass_at_k if audit else None,
                **{
                    role: controls[role].metrics["greedy_accuracy"] if controls[role] else None
                    for role in (layout.LABELED_ONLY, layout.GOLD_LABEL)
                },
                "labeled_only_steps": len(rewards) if rewards else None,
                "labeled_only_saturated_at": saturation_step(rewards) if rewards else None,
            }
        )
    return pl.DataFrame(rows, schema=SEED_SCHEMA)


SEED_SCHEMA = {
    "arm": pl.Utf8,
    "seed": pl.Utf8,  # `seed_label`: '3 (split 0)' where another seed drew the split
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
    """Of the seeds (`seed_rows`) whose labeled-only control logged its rewards, how many saw them saturate, and at
    which steps: '2 of 5 (steps 8, 12 of 24)'; 'not logged' where none logged them."""
    logged = seeds.filter(pl.col("labeled_only_steps").is_not_null())
    if not logged.height:
        return "not logged"
    steps = sorted(logged["labeled_only_saturated_at"].drop_nulls().to_list())
    at = f" (steps {', '.join(map(str, steps))} of {logged['labeled_only_steps'].max()})" if steps else ""
    return f"{len(steps)} of {logged.height}{at}"


def regime(arm: Arm) -> str:
    """What an arm sets besides its task and seed: 'n_labeled=4', or 'defaults'."""
    return group_label(arm, besides=("seed", "split_seed", "task"))


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
        "labeled_rl_passes": passes[LABELED_RL_RUN],
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


def line_name(task: str, regime: str) -> str:
    """A table line's name: its task, and its regime where it has one."""
    return task if regime == "defaults" else f"{task} {regime}"


def grid_task(table: pl.DataFrame) -> str | None:
    """The task (and regime) the label-source grid takes: of the lines where gold labels beat labeled-only (the
    interval over seeds excludes 0, on 3 seeds or more), the one with the most label headroom; None where no line has
    data headroom."""
    candidates = table.filter((pl.col("outcome") == "better") & (pl.col("data_headroom_seeds") >= 3))
    candidates = candidates.sort("label_headroom", descending=True, nulls_last=True)
    return line_name(candidates["task"][0], candidates["regime"][0]) if candidates.height else None


def headroom_verdict(table: pl.DataFrame) -> str:
    """The table's closing line: the label-source grid's task (`grid_task`), else what each task's data headroom
    says, an inconclusive one with the effect it could have missed."""
    chosen = grid_task(table)
    if chosen:
        return f"The label-source grid's task: {chosen}"
    verdicts = [
        f"{line_name(task, regime)}: "
        + (verdict.wording(outcome, mde) + (f" ({seeds} seeds)" if seeds > 1 else "") if mde is not None else outcome)
        for task, regime, outcome, mde, seeds in table.select(
            "task", "regime", "outcome", "data_headroom_mde", "data_headroom_seeds"
        ).iter_rows()
    ]
    return "No task shows data headroom (gold labels beating labeled-only on 3 seeds); " + "; ".join(verdicts) + "."
