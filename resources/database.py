"""The one switch to a shared instance: `NOISY_STUDENT_DATABASE_URL`, the URL of a PostgreSQL database.

Unset (the default, nothing to start), Dagster's instance is embedded SQLite under the data lake and MLflow's
store a SQLite file in it. Set, both live in that database, which several processes, machines or people can
write at once (parallel arms, the daemon, the UI and a grid together): Dagster's tables in the database's default
schema, MLflow's in the schema `mlflow` (both have a table `runs` and an `alembic_version`). Credentials belong in
libpq's own places (PGPASSWORD, ~/.pgpass), not in the URL. Postgres needs the `postgres` extra
(`pip install -e '.[postgres]'`)."""

from __future__ import annotations

from dagster._config import StringSource
from dagster._core.storage.base_storage import DagsterStorage
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage
from dagster._serdes import ConfigurableClass, ConfigurableClassData
from sqlalchemy.engine import make_url

from noisy_student_assets.core import environment

DATABASE_URL_ENV_VAR = environment.DATABASE_URL
MLFLOW_SCHEMA = "mlflow"


def database_url() -> str | None:
    """The shared database's URL, or None for the embedded stores. Its driver is psycopg2 whatever the URL names:
    SQLAlchemy 2.1 takes psycopg 3 for postgresql://, on which dagster-postgres's NOTIFY is a syntax error."""
    url = environment.database_url()
    return make_url(url).set(drivername="postgresql+psycopg2").render_as_string(hide_password=False) if url else None


def mlflow_store_uri(url: str) -> str:
    """MLflow's store in the database at `url`: the same database with the schema `mlflow` first on the
    search path, so that MLflow creates and reads its tables there."""
    database = make_url(url)
    options = " ".join(filter(None, [database.query.get("options"), f"-csearch_path={MLFLOW_SCHEMA}"]))
    return database.update_query_dict({"options": options}).render_as_string(hide_password=False)


def create_mlflow_schema(url: str) -> None:
    """Create MLflow's schema in the database at `url` if it is missing (MLflow creates tables, not schemas)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.NullPool)
    try:
        with engine.begin() as connection:
            connection.execute(sqlalchemy.text(f"CREATE SCHEMA IF NOT EXISTS {MLFLOW_SCHEMA}"))
    finally:
        engine.dispose()


class InstanceStorage(DagsterStorage, ConfigurableClass):
    """`dagster.yaml`'s storage: Dagster's own Postgres storage on the shared database when
    `NOISY_STUDENT_DATABASE_URL` is set, else its embedded SQLite storage under `base_dir`.

    Never instantiated: `from_config_value` returns one of Dagster's two storages. The URL stays out of the
    instance's config, so it is not written into the arguments of the processes Dagster starts for runs; they
    read it from the environment they inherit."""

    @classmethod
    def config_type(cls) -> dict:
        return {"base_dir": StringSource}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: dict) -> DagsterStorage:
        url = database_url()
        if url is None:
            return DagsterSqliteStorage.from_config_value(inst_data, config_value)
        try:
            from dagster_postgres import DagsterPostgresStorage
        except ImportError as missing:
            raise ImportError(
                f"{DATABASE_URL_ENV_VAR} is set: Postgres needs the postgres extra (pip install -e '.[postgres]')"
            ) from missing
        return DagsterPostgresStorage.from_config_value(inst_data, {"postgres_url": url})
