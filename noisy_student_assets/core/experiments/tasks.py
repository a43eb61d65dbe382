"""Tasks an experiment can name (no Dagster here): `experiments/tasks/*.yaml` (and `tasks/` of another experiments
directory). A task owns its problems: its training pool and its held-out set, which an arm's `task` field makes the
arm's `problem_pool` and `eval_problems`. Each is a problem source of any kind (`settings.ProblemSource`: a
reasoning_gym generator, a GSM8K or MATH-500 subset, a JSONL or parquet file, a Hugging Face dataset), or, in short,
a reasoning_gym generator and its options for both:

    chain-sums:
      description: "three one-digit numbers added or subtracted (reasoning_gym chain_sum): 7 - 2 + 9"
      name: chain_sum
      task_options: {min_terms: 3, max_terms: 3, min_digits: 1, max_digits: 1}
      eval_candidates: 280   # held-out candidates to generate (default: the CPU profile's 230)
    gsm8k-slice:
      description: "grade-school word problems: the first 200 of GSM8K's train split, 100 of its test split"
      pool: {kind: gsm8k, split: train, size: 200}
      held_out: {kind: gsm8k, split: test, size: 100}

The short form keeps the CPU profile's sizes and seeds (`CPU_TRAINING_SOURCE`, `CPU_EVAL_SOURCE`): 1000 problems
from seed 0, and the held-out candidates from seed 1000, the pool's prompts dropped.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from noisy_student_assets.core.experiments.directory import SHIPPED_EXPERIMENTS, default_experiments_dir
from noisy_student_assets.core.settings import CPU_EVAL_SOURCE, CPU_TRAINING_SOURCE, ProblemSource

TASKS_DIR = "tasks"
"""Under the experiments directory."""


@dataclass(frozen=True)
class Task:
    """A task's problems: the pool an arm draws its labeled, unlabeled and validation problems from, and its held-out
    set (the pool's prompts are dropped from it)."""

    name: str
    description: str
    training_source: ProblemSource
    eval_source: ProblemSource


def _reasoning_gym_sources(entry: dict) -> tuple[ProblemSource, ProblemSource]:
    """The pool and held-out sources of a task given in short, as a reasoning_gym generator and its options."""
    update = {"name": entry["name"], "task_options_json": json.dumps(entry.get("task_options", {}))}
    eval_candidates = entry.get("eval_candidates", CPU_EVAL_SOURCE.size)
    return (
        CPU_TRAINING_SOURCE.model_copy(update=update),
        CPU_EVAL_SOURCE.model_copy(update=update | {"size": eval_candidates}),
    )


SHORT_FORM = ("name", "task_options", "eval_candidates")
"""A task's fields in short, as a reasoning_gym generator; a task that gives `pool` and `held_out` gives none."""


def _task(name: str, entry: dict) -> Task:
    given = {"pool", "held_out"} & set(entry)
    if given != {"pool", "held_out"} and given:
        raise ValueError(
            f"task {name!r} gives {', '.join(given)} alone: a task gives both pool and held_out, or neither"
        )
    if given and (short := [field for field in SHORT_FORM if field in entry]):
        raise ValueError(f"task {name!r} gives pool and held_out: {', '.join(short)} belong to the short form")
    sources = (
        (ProblemSource(**entry["pool"]), ProblemSource(**entry["held_out"])) if given else _reasoning_gym_sources(entry)
    )
    return Task(name, entry.get("description", ""), *sources)


def tasks_dirs() -> list[Path]:
    """Where tasks are declared: the repository's `experiments/tasks/`, and `tasks/` of the experiments directory
    when that is another (`NOISY_STUDENT_EXPERIMENTS`)."""
    return list(dict.fromkeys([SHIPPED_EXPERIMENTS / TASKS_DIR, default_experiments_dir().resolve() / TASKS_DIR]))


def load_tasks(directories: list[Path] | None = None) -> dict[str, Task]:
    """Every task of the YAML files in `directories` (default: `tasks_dirs()`) by name; a name may appear once."""
    tasks: dict[str, Task] = {}
    for path in sorted(path for directory in directories or tasks_dirs() for path in directory.glob("*.yaml")):
        for name, task in _tasks_file(path, path.stat().st_mtime_ns).items():
            if name in tasks:
                raise ValueError(f"task {name!r} is declared twice ({path})")
            tasks[name] = task
    return tasks


@functools.lru_cache(maxsize=64)
def _tasks_file(path: Path, modified_ns: int) -> dict[str, Task]:
    """One tasks file's tasks, parsed once per version of the file: an arm's overrides read its task each time they
    are asked for (the grid's and the automation's staleness), and an edited file is read again."""
    return {name: _task(name, entry) for name, entry in (yaml.safe_load(path.read_text()) or {}).items()}


def task(name: str) -> Task:
    """The task called `name` (`tasks_dirs()`)."""
    tasks = load_tasks()
    if name not in tasks:
        where = " or ".join(str(directory) for directory in tasks_dirs())
        raise ValueError(f"no task {name!r} in {where}; the tasks: {', '.join(tasks) or 'none'}")
    return tasks[name]


def training_source(name: str) -> dict:
    """The pool of task `name`, whole (every field: written over a run config's source, it replaces it)."""
    return task(name).training_source.model_dump()


def eval_source(name: str) -> dict:
    """The held-out set of task `name`, whole."""
    return task(name).eval_source.model_dump()
