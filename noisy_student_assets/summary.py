"""`python -m noisy_student_assets.summary`: the run summary of the data lake (see
`noisy_student_assets.core.reporting.summary`)."""

from noisy_student_assets.core.reporting.summary import main
from resources import DataLake, MlflowTracking

if __name__ == "__main__":
    main(mlflow_store=MlflowTracking(lake=DataLake()).resolved_tracking_uri)
