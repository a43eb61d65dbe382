"""What MLflow's UI shows of the runs (resources/tracking.py), without a run: the names of every asset's run as the
runs table cuts them, and the address the Dagster metadata links to. The runs themselves, tagged and linked, are
tested on the tiny model's rounds (tests/integration/test_rounds.py); here, an arm's run keeps a point logged twice
once."""

from pathlib import Path

import dagster as dg
import pytest

from noisy_student_assets.core import environment, layout
from noisy_student_assets.defs.code_location import ASSETS_AND_CHECKS
from resources.data_lake import DataLake
from resources.tracking import MODEL_TRAINING_VIEW, MlflowTracking, run_name

SHOWN_CHARACTERS = 14
"""What MLflow 3.17's runs table showed of a name, at its default column width, before its ellipsis ("round_002/labe…"
stood for both a checkpoint and its evaluation)."""
ARM = "tau50-seed0"
"""An arm's name as long as the grid's."""


def _asset_key_paths() -> list[list[str]]:
    return [key.path for asset in ASSETS_AND_CHECKS if isinstance(asset, dg.AssetsDefinition) for key in asset.keys]


def test_every_assets_run_has_a_name_of_its_own() -> None:
    names = [run_name(path, ARM) for path in _asset_key_paths()]
    assert len(set(names)) == len(names) > len(layout.CONTROLS) * 2


def test_a_rounds_checkpoints_and_evaluations_differ_where_the_runs_table_cuts_them() -> None:
    for role in (layout.STUDENT_ROLE, *layout.CONTROLS):
        checkpoint = run_name(list(layout.round_asset(2, layout.checkpoint_of(role))), ARM)
        evaluation = run_name(list(layout.round_asset(2, layout.eval_of(role))), ARM)
        assert checkpoint[:SHOWN_CHARACTERS] != evaluation[:SHOWN_CHARACTERS], role
        assert checkpoint.startswith("r2 ckpt ") and evaluation.startswith("r2 eval "), role
        assert checkpoint.endswith(f" {ARM}") and evaluation.endswith(f" {ARM}")


def test_the_students_evaluation_is_named_as_such() -> None:
    assert run_name(list(layout.round_asset(3, layout.EVAL_REPORT)), ARM) == f"r3 eval student {ARM}"
    assert run_name(list(layout.round_asset(3, layout.STUDENT)), ARM) == f"r3 ckpt student {ARM}"
    assert run_name([layout.LABELED_RL_EVAL], ARM) == f"eval labeled-rl {ARM}"
    assert run_name([layout.VERDICT], None) == "verdict"


def test_a_filter_on_a_rounds_prefix_finds_only_that_rounds_runs() -> None:
    """`attributes.run_name LIKE 'r2 %'` finds round 2's runs, not round 12's."""
    paths = [*_asset_key_paths(), list(layout.round_asset(12, layout.EVAL_REPORT))]
    found = {"/".join(path) for path in paths if run_name(path, ARM).startswith("r2 ")}
    assert found == {"/".join(path) for path in paths if path[0] == layout.round_prefix(2)}
    assert len(found) > len(layout.CONTROLS) * 2


@pytest.mark.parametrize(
    ("ui_url", "variable", "expected"),
    [
        ("", None, "http://127.0.0.1:5000"),
        ("", "http://mlflow.example:8080/", "http://mlflow.example:8080"),
        ("http://127.0.0.1:5001/", "http://mlflow.example:8080", "http://127.0.0.1:5001"),
    ],
)
def test_links_go_to_the_configured_mlflow_ui_in_its_model_training_view(
    ui_url: str, variable: str | None, expected: str, tmp_path, monkeypatch
) -> None:
    if variable is None:
        monkeypatch.delenv(environment.MLFLOW_URL, raising=False)
    else:
        monkeypatch.setenv(environment.MLFLOW_URL, variable)
    tracking = MlflowTracking(lake=DataLake(root=str(tmp_path)), ui_url=ui_url)
    assert tracking.run_url("4", "abc") == f"{expected}/#/experiments/4/runs/abc?{MODEL_TRAINING_VIEW}"
    assert tracking.runs_url("4") == f"{expected}/#/experiments/4/runs?{MODEL_TRAINING_VIEW}"


def test_a_point_logged_again_into_an_arm_s_run_is_kept_once(tmp_path: Path, monkeypatch) -> None:
    """An evaluation materialized again logs its round's point again: the arm's run keeps one point per value."""
    import mlflow

    monkeypatch.delenv("NOISY_STUDENT_DATABASE_URL", raising=False)
    tracking = MlflowTracking(lake=DataLake(root=str(tmp_path)))
    mlflow.set_tracking_uri(tracking.resolved_tracking_uri)
    # An experiment of this store, named: an earlier test in this process may have left another store's active.
    experiment_id = mlflow.MlflowClient(tracking.resolved_tracking_uri).create_experiment("tests")
    with mlflow.start_run(experiment_id=experiment_id) as active:
        for value in (0.5, 0.5, 0.625):
            tracking.log_to_arm_run("a", "tests", {"greedy_accuracy/student": value}, step=1)
    client = mlflow.MlflowClient(tracking.resolved_tracking_uri)
    (run,) = client.search_runs([active.info.experiment_id], "tags.role = 'arm'")
    points = client.get_metric_history(run.info.run_id, "greedy_accuracy/student")
    assert sorted((point.step, point.value) for point in points) == [(1, 0.5), (1, 0.625)]
