"""`python -m noisy_student_assets.summary [--experiment experiments/<name>.yaml]`: the run summary of the data
lake, of every experiment's arms or of one experiment's (see `noisy_student_assets.core.reporting.summary`)."""

import argparse
from pathlib import Path

from noisy_student_assets.core.reporting.summary import main
from resources import DataLake, MlflowTracking

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--experiment", type=Path, help="an experiment file: its arms only (default: every experiment's in the lake)")
    args = parser.parse_args()
    main(mlflow_store=MlflowTracking(lake=DataLake()).resolved_tracking_uri, experiment=args.experiment.stem if args.experiment else None)
