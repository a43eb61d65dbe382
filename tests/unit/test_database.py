"""The one switch to a shared instance (resources/database.py), without a server: which stores each setting gives
(tests/postgres runs them on a real PostgreSQL)."""

import shutil
from pathlib import Path

import dagster as dg
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage

from noisy_student_assets.core import layout
from resources.data_lake import DataLake
from resources.database import DATABASE_URL_ENV_VAR, database_url
from resources.tracking import MlflowTracking

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_unset_the_instance_and_the_mlflow_store_are_sqlite_in_the_lake(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(DATABASE_URL_ENV_VAR, raising=False)
    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.chdir(tmp_path)  # dagster.yaml's storage paths are relative to the working directory
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert isinstance(instance.get_ref().storage, DagsterSqliteStorage)
    assert (tmp_path / "data_lake" / ".dagster" / "storage").is_dir()
    lake = DataLake(root=str(tmp_path / "data_lake"))
    assert MlflowTracking(lake=lake).resolved_tracking_uri == f"sqlite:///{lake.root_path / layout.TRACKING_DB_NAME}"


def test_set_both_stores_use_the_database_mlflow_in_a_schema_of_its_own(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(DATABASE_URL_ENV_VAR, "postgresql://ns@db.example:6543/noisy?options=-cstatement_timeout%3D0")
    assert database_url() == "postgresql+psycopg2://ns@db.example:6543/noisy?options=-cstatement_timeout%3D0", (
        "psycopg2 for Dagster's NOTIFY"
    )
    lake = DataLake(root=str(tmp_path))
    store = "postgresql+psycopg2://ns@db.example:6543/noisy?options=-cstatement_timeout%3D0+-csearch_path%3Dmlflow"
    assert MlflowTracking(lake=lake).resolved_tracking_uri == store, "the URL's own options are kept"
    assert (
        MlflowTracking(lake=lake, tracking_uri="http://mlflow.example:5000").resolved_tracking_uri
        == "http://mlflow.example:5000"
    )
