"""Fixtures for tests that drive the `dagster` CLI."""

from pathlib import Path

import pytest

from tests.cli import DagsterCli


@pytest.fixture
def dagster_cli(tmp_path: Path) -> DagsterCli:
    return DagsterCli(tmp_path)
