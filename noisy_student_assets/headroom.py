"""The headroom table over tasks (`noisy_student_assets.core.reporting.headroom`), from the command line.

    python -m noisy_student_assets.grid run experiments/headroom.yaml   # every task's seeds, in the data lake
    python -m noisy_student_assets.headroom                            # the table, from the data lake
    python -m noisy_student_assets.headroom --lake results             # from a results directory (`summary --export`)

The experiment is an ordinary one: each arm names its task (`experiments/tasks/`) and its seed, and the grid runs
them in the default Dagster home and lake like any other arms; `--arm` and `--through` select as usual.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import load_experiment
from noisy_student_assets.core.reporting.headroom import headroom_table, headroom_verdict
from noisy_student_assets.core.reporting.markdown import markdown_table

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "headroom.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--lake", type=Path, default=None, help="read this directory (a results directory) instead of the data lake"
    )
    parser.add_argument("--experiment", type=Path, default=EXPERIMENT, help="the experiment whose arms make the table")
    args = parser.parse_args(argv)
    table = headroom_table(args.lake or layout.default_lake_root(), load_experiment(args.experiment).all_arms())
    print(markdown_table(table.with_columns(pl.col(pl.Float64).round(3))))
    print(f"\n{headroom_verdict(table)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
