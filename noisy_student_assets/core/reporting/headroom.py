"""The headroom table: per task, what a better judge of the samples can win, and whether better labels can
matter at all (no Dagster here).

- label headroom: the labeled-RL teacher's greedy accuracy on the validation split, and over its K samples
  of the unlabeled problems (the round's audit against the hidden gold) the majority's accuracy (maj@K) and
  the oracle's (pass@K). pass@K minus maj@K is what a label source can win over the plain vote;
- data headroom: the round's gold-label control minus its labeled-only control on the held-out set, paired by
  problem and pooled over the seeds (`verdict.paired_difference`). Where perfect labels do not beat the labels
  alone, no label source can make a better student.

Each task runs `experiments/headroom.yaml` in a lake and a Dagster instance of its own
(`python -m noisy_student_assets.headroom`): the task is the run config of the shared `problem_pool` and
`eval_problems` assets, one per lake.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import yaml

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import Arm
from noisy_student_assets.core.pseudo_labels.labels import AUDIT_FILE, PublishedAudit
from noisy_student_assets.core.reporting import verdict
from noisy_student_assets.core.reporting.eval_report import PublishedEval
from noisy_student_assets.core.reporting.summary import read_evaluation
from noisy_student_assets.core.settings import DEFAULT_EVAL_SOURCE, DEFAULT_TRAINING_SOURCE, ProblemSource

HEADROOM_DIR = "headroom"
"""Under the data lake: one directory per task, the task's Dagster home and its lake (`task_home`)."""
ROUND = 1


@dataclass(frozen=True)
class Task:
    """A task of the headroom table: a reasoning_gym generator and its options, for the pool and the held-out set."""

    name: str
    description: str
    generator: str
    task_options: dict
    eval_candidates: int = DEFAULT_EVAL_SOURCE.size
    """Held-out problems to generate; those whose prompt is in the pool are dropped (a task of few distinct prompts
    needs more candidates for as many held-out problems)."""

    def source(self, template: ProblemSource, size: int | None = None) -> ProblemSource:
        """`template` (the CPU profile's pool or held-out source: its seed, and its size unless given) with this
        task's generator."""
        update = {
            "name": self.generator,
            "task_options_json": json.dumps(self.task_options),
            "size": size or template.size,
        }
        return template.model_copy(update=update)

    def run_config(self) -> dict:
        """The run config (the dagster CLI's format) that makes this task the lake's pool and held-out set."""
        return {
            "ops": {
                layout.PROBLEM_POOL: {"config": {"source": self.source(DEFAULT_TRAINING_SOURCE).model_dump()}},
                layout.EVAL_PROBLEMS: {
                    "config": {"source": self.source(DEFAULT_EVAL_SOURCE, self.eval_candidates).model_dump()}
                },
            }
        }


def load_tasks(path: Path) -> dict[str, Task]:
    """The tasks file (experiments/tasks/headroom.yaml): name -> {description, name (generator), task_options,
    eval_candidates (optional)}."""
    document = yaml.safe_load(path.read_text()) or {}
    if DEFAULT_TRAINING_SOURCE.kind != "reasoning_gym":
        raise ValueError(
            "the headroom tasks are reasoning_gym generators, and this profile's pool is "
            f"{DEFAULT_TRAINING_SOURCE.describe()}"
        )
    return {
        name: Task(
            name=name,
            description=entry.get("description", ""),
            generator=entry["name"],
            task_options=entry.get("task_options", {}),
            eval_candidates=entry.get("eval_candidates", DEFAULT_EVAL_SOURCE.size),
        )
        for name, entry in document.items()
    }


def task_home(lake: Path, task: str) -> Path:
    """The task's Dagster home (its dagster.yaml keeps the instance under `data_lake/` beside it)."""
    return lake / HEADROOM_DIR / task


def task_lake(lake: Path, task: str) -> Path:
    return task_home(lake, task) / "data_lake"


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
    """One row per arm (seed) that has its labeled-RL validation and its round's audit: the label headroom's parts
    and the two controls' held-out greedy accuracy (`evals`: `control_evals`)."""
    rows = []
    for arm in arms:
        validation = read_evaluation(lake, layout.LABELED_RL_VALIDATION, arm.name)
        labels_dir = layout.artifact_dir(lake, layout.round_asset(ROUND, layout.PSEUDO_LABELS), arm.name)
        if validation is None or not (labels_dir / AUDIT_FILE).exists():
            continue
        audit = PublishedAudit.read(labels_dir)
        controls = evals[arm.name]
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
}


def data_headroom(evals: dict[str, dict[str, PublishedEval | None]]) -> verdict.Difference | None:
    """Gold-label minus labeled-only on the held-out set, paired by problem, over the arms that have both
    (`evals`: `control_evals`)."""
    pairs = [
        (controls[layout.GOLD_LABEL].scores, controls[layout.LABELED_ONLY].scores)
        for controls in evals.values()
        if controls[layout.GOLD_LABEL] and controls[layout.LABELED_ONLY]
    ]
    if not pairs:
        return None
    treatment, control = verdict.paired_scores(pairs)
    return verdict.paired_difference(treatment, control, treatment_name="gold-label", control_name="labeled-only")


def task_row(task: Task, lake: Path, arms: list[Arm]) -> dict:
    """The task's line of the table: seed means of the label headroom, and the data headroom with its interval."""
    evals = control_evals(lake, arms)
    seeds = seed_rows(lake, arms, evals)
    difference = data_headroom(evals)
    means = (
        seeds.select(pl.exclude("arm", "seed").mean()).row(0, named=True)
        if seeds.height
        else dict.fromkeys(SEED_SCHEMA)
    )
    return {
        "task": task.name,
        "seeds": seeds.height,
        "teacher_validation_greedy": means["teacher_validation_greedy"],
        "maj_at_k": means["maj_at_k"],
        "pass_at_k": means["pass_at_k"],
        "label_headroom": None if means["pass_at_k"] is None else means["pass_at_k"] - means["maj_at_k"],
        "labeled_only": means["labeled_only"],
        "gold_label": means["gold_label"],
        "data_headroom": difference.estimate if difference else None,
        "data_headroom_low": difference.low if difference else None,
        "data_headroom_high": difference.high if difference else None,
        "data_headroom_seeds": difference.seeds if difference else 0,
        "outcome": difference.outcome if difference else "not run",
    }


def grid_task(table: pl.DataFrame) -> str | None:
    """The task the label-source grid takes: of the tasks where gold labels beat labeled-only (the interval over
    seeds excludes 0, on 3 seeds or more), the one with the most label headroom; None where no task has data
    headroom."""
    candidates = table.filter((pl.col("outcome") == "better") & (pl.col("data_headroom_seeds") >= 3))
    candidates = candidates.sort("label_headroom", descending=True, nulls_last=True)
    return candidates["task"][0] if candidates.height else None
