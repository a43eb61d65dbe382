"""`python -m noisy_student_assets.summary [--experiment experiments/<name>.yaml] [--lake DIR] [--export DIR]
[--figures DIR]`: the
run summary of the data lake (or of a results directory), of every experiment's arms or of one experiment's (see
`noisy_student_assets.core.reporting.summary`); `--export` copies the summarized arms' results (evaluations, audits,
a checkpoint's records but not its weights: `core.lake_reader.export_results`) into a directory that the summary
reads as it reads a lake; `--figures` writes the break-even figures (a student and the label controls against the
accuracy of their labels) into a directory."""

import argparse
from pathlib import Path

from noisy_student_assets.core.reporting.summary import main
from resources import DataLake, MlflowTracking

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--experiment", type=Path, help="an experiment file: its arms only (default: every experiment's in the lake)"
    )
    parser.add_argument("--lake", type=Path, help="a lake or a results directory to read (default: the data lake)")
    parser.add_argument(
        "--export", type=Path, help="copy the summarized arms' results into this directory (e.g. results/<name>)"
    )
    parser.add_argument("--figures", type=Path, help="write the break-even figures there (PNG)")
    args = parser.parse_args()
    main(
        mlflow_store=MlflowTracking(lake=DataLake()).resolved_tracking_uri,
        experiment=args.experiment.stem if args.experiment else None,
        lake=args.lake,
        export=args.export,
        figures=args.figures,
    )
