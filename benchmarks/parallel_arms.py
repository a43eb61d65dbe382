"""Wall time of two arms (experiments/parallel_arms.yaml): one after another in process, then both at once on a
local Ray cluster declaring 2 GPUs (`grid run --launcher ray --parallel-arms 2 --ray-gpus 2`), each from an empty
instance and lake. Both runs give every heavy stage one thread (the experiment's `compute: {cpu_threads: 1}`): one
arm at a time leaves a core idle, two at once can use both. The runs are shortened alike (the run config below: 60
eval candidates, 16 unlabeled problems; the experiment's 1-step trainings): a timing, not a result.

    .venv/bin/python benchmarks/parallel_arms.py          # writes benchmarks/results/parallel_arms.json and
                                                          # docs/parallel-arms.png
    .venv/bin/python benchmarks/parallel_arms.py --plot   # draws the figure again from the saved results
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = REPO / "experiments" / "parallel_arms.yaml"
RUNS = {
    "one after another, in process": ["--launcher", "inprocess"],
    "--parallel-arms 2 on Ray (2 declared GPUs)": ["--launcher", "ray", "--parallel-arms", "2", "--ray-gpus", "2"],
}


def shortened() -> dict:
    """Run config of both runs: a smaller held-out set and unlabeled pool than the cpu profile's."""
    from noisy_student_assets.core.settings import two_digit_addition

    eval_source = two_digit_addition(size=60, seed=1000).model_dump()
    return {
        "ops": {"eval_problems": {"config": {"source": eval_source}}, "problem_split": {"config": {"n_unlabeled": 16}}}
    }


def run_grid(options: list[str]) -> float:
    from noisy_student_assets.defs.grid import command as grid_command

    home = Path(tempfile.mkdtemp(prefix="noisy-student-parallel-arms-"))
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    env = os.environ | {"DAGSTER_HOME": str(home), "NOISY_STUDENT_DATA_LAKE": str(home / "data_lake")}
    env.pop("RAY_ADDRESS", None)
    started = time.perf_counter()
    subprocess.run(grid_command("run", EXPERIMENT, shortened(), *options), cwd=home, env=env, check=True)
    return time.perf_counter() - started


RESULTS = REPO / "benchmarks" / "results" / "parallel_arms.json"


def plot(results: dict) -> None:
    """The two wall times as bars: `docs/parallel-arms.png`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = results["wall_seconds"]
    figure, axis = plt.subplots(figsize=(7.5, 2.6))
    names = list(seconds)
    axis.barh(names, [seconds[name] / 60 for name in names], color=["#888888", "#3b75af"])
    for row, name in enumerate(names):
        axis.text(seconds[name] / 60, row, f" {seconds[name] / 60:.1f} min", va="center")
    axis.set_xlabel(
        "wall minutes: 2 arms x 1 round, every heavy stage on 1 thread\n"
        "(SmolLM2-135M, cpu profile, shortened: a timing, not a result)"
    )
    axis.set_title(
        f"{results['cores']}-core CPU machine, no GPU; {results['date']}, commit {results['commit']}", fontsize=9
    )
    axis.invert_yaxis()
    axis.set_xlim(0, max(seconds.values()) / 60 * 1.25)
    figure.tight_layout()
    figure.savefig(REPO / "docs" / "parallel-arms.png", dpi=120)


def main() -> None:
    """Run both grids and plot them; `--plot`: plot the saved results again."""
    if sys.argv[1:] != ["--plot"]:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        seconds = {name: run_grid(options) for name, options in RUNS.items()}
        results = {
            "date": time.strftime("%Y-%m-%d"),
            "commit": commit,
            "cores": os.cpu_count(),
            "wall_seconds": seconds,
        }
        RESULTS.write_text(json.dumps(results, indent=2))
    results = json.loads(RESULTS.read_text())
    plot(results)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
