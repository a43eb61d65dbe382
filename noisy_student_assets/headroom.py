"""The headroom table over tasks (`noisy_student_assets.core.reporting.headroom`), from the command line.

    python -m noisy_student_assets.headroom run                  # every task's grid, each in its own lake
    python -m noisy_student_assets.headroom run --task products  # one task's
    python -m noisy_student_assets.headroom run --arm headroom-s0  # every task's first seed: a screen
    python -m noisy_student_assets.headroom table                # the table, from the lakes
    python -m noisy_student_assets.headroom summary --task products   # a task's run summary (its lake's)
    python -m noisy_student_assets.headroom export                # the tasks' results into results/ (no checkpoints)
    python -m noisy_student_assets.headroom table --lake results  # the table from them, without the lakes
    python -m noisy_student_assets.headroom run --experiment experiments/label_source_grid.yaml --task products
                                        # another experiment on a task's lake (the grid the table picks a task for)
    python -m noisy_student_assets.headroom run --experiment experiments/label_source_grid.yaml --task two-digit-sums \
        --arm lsg-verifier-s0 --through round_001/pseudo_labels   # its labels alone (the direct effect)

`run` runs `python -m noisy_student_assets.grid run experiments/headroom.yaml` once per task of
experiments/tasks/headroom.yaml, with the task's pool and held-out set as run config, in `<data lake>/headroom/<task>/`:
a Dagster home (this repository's dagster.yaml) whose instance and lake live there, so the task's runs, checks and
lineage show in `dagster dev` started from that directory. Like the grid it resumes where it stopped.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl

from noisy_student_assets.core import environment, layout
from noisy_student_assets.core.experiments.arms import load_experiment
from noisy_student_assets.core.reporting.headroom import grid_task, load_tasks, task_home, task_lake, task_row
from noisy_student_assets.core.reporting.markdown import markdown_table
from noisy_student_assets.core.reporting.results import export_results
from noisy_student_assets.defs.grid import add_arm_selection
from noisy_student_assets.defs.grid import command as grid_command

REPOSITORY = Path(__file__).resolve().parents[1]
EXPERIMENT = REPOSITORY / "experiments" / "headroom.yaml"
TASKS = REPOSITORY / "experiments" / "tasks" / "headroom.yaml"


def run(task_names: list[str], arms: list[str], experiment: Path = EXPERIMENT, through: list[str] | None = None) -> int:
    """Each task's grid in turn (`through`: the grid's `--through`); a task whose grid fails does not stop the next.
    The exit code is the first failure's."""
    lake = layout.default_lake_root()
    tasks = load_tasks(TASKS)
    failed = {}
    for name in task_names or list(tasks):
        home = task_home(lake, name)
        home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(
            REPOSITORY / "dagster.yaml", home / "dagster.yaml"
        )  # its storage paths are relative to the home
        env = environment.own_instance(home, task_lake(lake, name))
        print(f"[headroom] {name}: {tasks[name].description} ({home})", flush=True)
        command = grid_command("run", experiment.resolve(), tasks[name].run_config())
        command += [option for arm in arms for option in ("--arm", arm)]
        command += [option for name in through or () for option in ("--through", name)]
        returncode = subprocess.run(command, cwd=home, env=env).returncode
        if returncode:
            print(
                f"[headroom] {name}: the grid exited with {returncode} (`grid checks` in {home} says which check "
                "stopped it)",
                flush=True,
            )
            failed[name] = returncode
    if failed:
        print(f"[headroom] failed: {', '.join(failed)}", flush=True)
    return next(iter(failed.values()), 0)


def summary(task_names: list[str], experiment: Path, root: Path) -> int:
    """The run summary of `experiment`'s arms in each task's lake under `root` (the data lake, or a results directory
    `export` wrote): `python -m noisy_student_assets.summary --lake <the task's lake>`."""
    for name in task_names or list(load_tasks(TASKS)):
        print(f"\n# {name}", flush=True)
        command = [
            sys.executable,
            "-m",
            "noisy_student_assets.summary",
            "--experiment",
            str(experiment.resolve()),
            "--lake",
            str(task_lake(root, name)),
        ]
        env = environment.own_instance(
            task_home(root, name), task_lake(root, name)
        )  # the MLflow store it names is the task's
        if returncode := subprocess.run(command, env=env).returncode:
            return returncode
    return 0


def export(task_names: list[str], experiment: Path, destination: Path) -> int:
    """Each task's results of `experiment`'s arms (evaluations and audits: `core.reporting.results`) into
    `destination`, in the layout `table` and `summary` read (`--lake <destination>`)."""
    lake, arms = layout.default_lake_root(), [arm.name for arm in load_experiment(experiment).all_arms()]
    for name in task_names or list(load_tasks(TASKS)):
        if task_lake(lake, name).is_dir():
            copied = export_results(task_lake(lake, name), arms, task_lake(destination, name))
            print(f"[headroom] {name}: {len(copied)} files into {task_lake(destination, name)}", flush=True)
    return 0


def table(root: Path) -> pl.DataFrame:
    """The headroom table of the tasks' lakes under `root` (the data lake, or a results directory `export` wrote)."""
    arms = load_experiment(EXPERIMENT).all_arms()
    return pl.DataFrame([task_row(task, task_lake(root, name), arms) for name, task in load_tasks(TASKS).items()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "summary", "table", "export"])
    parser.add_argument(
        "--task", action="append", default=[], help="run, summary: this task only (repeatable; default: every task)"
    )
    add_arm_selection(parser)  # passed on to each task's grid
    parser.add_argument(
        "--experiment",
        type=Path,
        default=EXPERIMENT,
        help="run, summary, export: the experiment on each task's lake (default: headroom's)",
    )
    parser.add_argument(
        "--lake",
        type=Path,
        default=None,
        help="summary, table: read the tasks' lakes under this directory (a results directory) instead of the data"
        " lake",
    )
    parser.add_argument(
        "--to", type=Path, default=Path("results"), help="export: the results directory (default: results/)"
    )
    args = parser.parse_args(argv)
    root = args.lake or layout.default_lake_root()
    if args.command == "run":
        return run(args.task, args.arm, args.experiment, args.through)
    if args.command == "summary":
        return summary(args.task, args.experiment, root)
    if args.command == "export":
        return export(args.task, args.experiment, args.to)
    headroom = table(root)
    print(markdown_table(headroom.with_columns(pl.col(pl.Float64).round(3))))
    chosen = grid_task(headroom)
    print(
        f"\nThe label-source grid's task: {chosen}"
        if chosen
        else "\nNo task has data headroom (gold labels beating labeled-only on 3 seeds)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
