"""Labeled RL and two Noisy Student rounds materialized in-process with a tiny random model."""

from __future__ import annotations

import json
import os

import dagster as dg
import mlflow
import polars as pl
import pytest

from noisy_student_assets.checkpoints import weights_sha256
from noisy_student_assets.definitions import ASSETS_AND_CHECKS
from resources import lake_resources
from resources.compute import ComputeResource
from resources.data_lake import DataLake
from resources.tracking import MlflowTracking
from tests.lakes import metadata_of
from tests.tiny_configs import ROUND_SELECTION, controls_config, foundation_config, round_config

@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> DataLake:
    return DataLake(root=str(tmp_path_factory.mktemp("lake")))


@pytest.fixture(scope="module")
def resources(lake: DataLake) -> dict:
    return lake_resources(lake, ComputeResource(device="cpu", dtype="float32"))


@pytest.fixture(scope="module")
def instance() -> dg.DagsterInstance:
    with dg.instance_for_test() as instance:
        yield instance


ASSETS = ASSETS_AND_CHECKS


def materialize(selection, resources, instance, config, partition=None) -> dg.ExecuteInJobResult:
    result = dg.materialize(
        ASSETS, selection=selection, resources=resources, instance=instance, run_config=config, partition_key=partition
    )
    assert result.success
    return result


@pytest.fixture(scope="module")
def two_rounds(lake, resources, instance, tiny_model_dir) -> dict[str, dg.ExecuteInJobResult]:
    foundation = dg.AssetSelection.groups("problems", "models", "controls")
    config = foundation_config(tiny_model_dir)
    config["ops"] |= controls_config()["ops"]
    results = {"foundation": materialize(foundation, resources, instance, config)}
    for round_key in ("round-001", "round-002"):
        results[round_key] = materialize(ROUND_SELECTION, resources, instance, round_config(), round_key)
    return results


def test_round_two_samples_from_round_one_student(two_rounds, lake: DataLake) -> None:
    round_one_student = lake.artifact_dir(dg.AssetKey("student_checkpoint"), "round-001")
    labeled_rl = lake.artifact_dir(dg.AssetKey("labeled_rl_checkpoint"))
    first = lake.read_table(dg.AssetKey("generations"), "round-001")
    second = lake.read_table(dg.AssetKey("generations"), "round-002")
    assert set(first["checkpoint"]) == {f"{labeled_rl} sha256:{weights_sha256(labeled_rl)[:12]}"}
    assert set(second["checkpoint"]) == {f"{round_one_student} sha256:{weights_sha256(round_one_student)[:12]}"}
    metadata = metadata_of(two_rounds["round-002"], "generations")
    assert metadata["teacher"].value == str(round_one_student)


def test_round_artifacts_and_reports(two_rounds, lake: DataLake) -> None:
    generations = lake.read_table(dg.AssetKey("generations"), "round-001")
    assert generations.height == 6 * 3 and set(generations["sample_index"]) == {0, 1, 2}
    labels = lake.read_table(dg.AssetKey("pseudo_labels"), "round-001")
    assert labels.height == 6 and "hidden_gold_answer" not in labels.columns
    for round_key in ("round-001", "round-002"):
        report = lake.artifact_dir(dg.AssetKey("eval_report"), round_key)
        metrics = json.loads((report / "metrics.json").read_text())["metrics"]
        assert 0.0 <= metrics["greedy_accuracy"] <= 1.0 and "pass@2" in metrics and "maj@2" in metrics
        assert "delta_vs_labeled_rl/greedy_accuracy" in metrics and "delta_vs_base_model/greedy_accuracy" in metrics
    second = json.loads((lake.artifact_dir(dg.AssetKey("eval_report"), "round-002") / "metrics.json").read_text())
    assert "delta_vs_previous_round/greedy_accuracy" in second["metrics"]
    metadata = metadata_of(two_rounds["round-002"], "eval_report")
    assert isinstance(metadata["greedy_accuracy"].value, float) and "report" in metadata
    checks = two_rounds["round-002"].get_asset_check_evaluations()
    assert {c.check_name for c in checks} == {
        "pseudo_label_quality", "no_eval_regression", "eval_not_degenerate", "finite_weights", "smoke_generation"
    }
    assert all(c.passed for c in checks if c.check_name != "no_eval_regression")


def test_mlflow_runs_are_tagged_per_asset_and_round(two_rounds, lake: DataLake) -> None:
    mlflow.set_tracking_uri(MlflowTracking(lake=lake).resolved_tracking_uri)
    runs = mlflow.search_runs(experiment_names=["noisy-student"], output_format="list")
    seen = {(r.data.tags["dagster.asset"], r.data.tags["dagster.partition"]) for r in runs}
    for asset in ROUND_SELECTION:
        assert {(asset, "round-001"), (asset, "round-002")} <= seen
    assert {("labeled_rl_checkpoint", ""), ("base_model_eval", ""), ("labeled_rl_eval", "")} <= seen
    student_run_id = metadata_of(two_rounds["round-001"], "student_checkpoint")["mlflow_run_id"].value
    student_run = mlflow.get_run(student_run_id)
    assert student_run.data.tags["dagster.run_id"] == two_rounds["round-001"].run_id
    assert any(key.startswith("train") or key.startswith("reward") for key in student_run.data.metrics)


def test_no_log_or_metadata_shows_the_tracking_uri(two_rounds, lake: DataLake, instance) -> None:
    uri = MlflowTracking(lake=lake).resolved_tracking_uri
    for result in two_rounds.values():
        for entry in instance.all_logs(result.run_id):
            assert uri not in f"{entry.message} {entry.dagster_event!r}"
    assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"  # a remote store's URL stays off stdout


def test_new_tau_reuses_samples(two_rounds, lake, resources, instance) -> None:
    path = lake.artifact_dir(dg.AssetKey("generations"), "round-002") / "data.parquet"
    before = pl.read_parquet(path)
    result = materialize(
        ["generations", "pseudo_labels", "student_checkpoint"], resources, instance, round_config(tau=0.9, with_eval=False), "round-002"
    )
    assert metadata_of(result, "generations")["reused_cached_samples"].value is True
    assert metadata_of(result, "pseudo_labels")["tau"].value == 0.9
    assert pl.read_parquet(path).equals(before)


def test_a_failed_label_floor_stops_the_round_before_training(two_rounds, lake, resources, instance) -> None:
    config = round_config(tau=1.0, with_eval=False)
    config["ops"]["noisy_student_round"]["config"]["min_coverage"] = 1.0
    result = dg.materialize(
        ASSETS,
        selection=["generations", "pseudo_labels", "student_checkpoint"],
        resources=resources,
        instance=instance,
        run_config=config,
        partition_key="round-003",
        raise_on_error=False,
    )
    assert not result.success
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == "pseudo_label_quality" and not check.passed
    assert lake.artifact_dir(dg.AssetKey("pseudo_labels"), "round-003").exists()
    assert not lake.artifact_dir(dg.AssetKey("student_checkpoint"), "round-003").exists()
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "failed their quality floor: tau=1.0 keeps" in failure.event_specific_data.error.message
    assert check.description.startswith("tau=1.0 keeps")


def test_gold_label_control_trains_on_the_hidden_gold(two_rounds, lake: DataLake) -> None:
    metadata = metadata_of(two_rounds["foundation"], "gold_label_rl_checkpoint")
    assert (metadata["gold_rows"].value, metadata["pseudo_rows"].value) == (4 + 6, 0)
    assert metadata["init_checkpoint"].value == str(lake.artifact_dir(dg.AssetKey("labeled_rl_checkpoint")))
    assert (lake.artifact_dir(dg.AssetKey("gold_label_rl_eval")) / "metrics.json").is_file()


FIGURES = ("accuracy_by_checkpoint", "agreement_histogram", "label_accuracy_vs_agreement")


def test_round_report_has_figures_calibration_and_the_gold_gain(two_rounds, lake: DataLake) -> None:
    report = lake.artifact_dir(dg.AssetKey("eval_report"), "round-002")
    metrics = json.loads((report / "metrics.json").read_text())["metrics"]
    assert "share_of_gold_gain" in metrics and "delta_vs_previous_round/greedy_accuracy" in metrics
    text = (report / "report.md").read_text()
    assert "## Pseudo-label calibration" in text and "| [0.9, 1.0] |" in text
    # Every checkpoint evaluated so far, in order, this round included.
    accuracy_rows = [line.split("|")[1].strip() for line in text.split("## Accuracy per checkpoint")[1].split("##")[0].splitlines() if line.startswith("| ")]
    assert accuracy_rows[1:] == ["base_model", "labeled_rl", "round-001", "round-002", "gold_label_rl"]
    metadata = metadata_of(two_rounds["round-002"], "eval_report")
    for figure in FIGURES:
        assert (report / f"{figure}.png").read_bytes().startswith(b"\x89PNG")
        assert metadata[figure].value.startswith(f"![{figure}](data:image/png;base64,")
    assert "| [0.9, 1.0] |" in metadata["pseudo_label_calibration"].value
    mlflow.set_tracking_uri(MlflowTracking(lake=lake).resolved_tracking_uri)
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(metadata["mlflow_run_id"].value, "eval_report")}
    assert {f"eval_report/{figure}.png" for figure in FIGURES} <= artifacts
