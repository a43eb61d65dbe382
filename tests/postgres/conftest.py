"""The Postgres suite (`make postgres-test`, marker `postgres`): tests/postgres/with_server.sh runs it beside a
throwaway PostgreSQL server and names it in NOISY_STUDENT_TEST_POSTGRES; each test gets a database of its own."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy

pytest.importorskip(
    "dagster_postgres", reason="the Postgres suite needs the postgres extra (make postgres-test installs it)"
)

from resources.database import DATABASE_URL_ENV_VAR
from tests.cli import DagsterCli


@pytest.fixture
def database_url() -> Iterator[str]:
    """A new, empty database on the suite's server; dropped after the test."""
    server = os.environ.get("NOISY_STUDENT_TEST_POSTGRES")
    if not server:
        pytest.fail("no PostgreSQL server: run the suite under tests/postgres/with_server.sh (make postgres-test)")
    name = f"test_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.NullPool)
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    yield sqlalchemy.make_url(server).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f"DROP DATABASE {name} WITH (FORCE)"))


@pytest.fixture
def shared_cli(tmp_path: Path, database_url: str, monkeypatch) -> DagsterCli:
    """A scratch project whose instance and MLflow store are the test's database (the one setting set, for the
    commands it runs and for this process)."""
    monkeypatch.setenv(DATABASE_URL_ENV_VAR, database_url)
    cli = DagsterCli(tmp_path)
    cli.env[DATABASE_URL_ENV_VAR] = database_url
    return cli
