"""Labeled RL, two Noisy Student rounds with their compute-matched controls, and the verdict, materialized
in-process for arm `a` with a tiny random model."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import dagster as dg
import mlflow
import polars as pl
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.checkpoints import weights_sha256
from noisy_student_assets.core.lake_reader import ArmLake
from noisy_student_assets.core.promotion import read_promotion
from noisy_student_assets.core.reporting.eval_report import REPORT_NAME
from noisy_student_assets.core.reporting.test_time import ALL_EVAL
from noisy_student_assets.core.training.compute import MATCHED_FIELDS, read_compute
from noisy_student_assets.defs.assets.verdict import DIFFERENCE
from noisy_student_assets.defs.checks import COMPUTE_MATCHED
from noisy_student_assets.defs.code_location import ASSETS_AND_CHECKS, defs
from resources.data_lake import DataLake
from resources.tracking import (
    ARM_ROLE,
    ARM_TAG,
    BY_ROUND,
    DAGSTER_RUN_URL_TAG,
    EXPERIMENT_TAG,
    NOTE_TAG,
    ROLE_TAG,
    ROUND_TAG,
    MlflowTracking,
)
from tests.lakes import arms_instance, isolated_resources, materialize, metadata_of
from tests.tiny_configs import FOUNDATION, TINY_GRPO, op, round_chain, round_names, tiny_config, with_op_config

ARM = "a"
SNAPSHOTS = Path(__file__).resolve().parents[1] / "snapshots"
ROUND_1 = round_chain(1, *layout.DEFAULT_CONTROLS)
ROUND_2 = round_chain(2, layout.LABELED_ONLY)


def key(number: int, name: str) -> dg.AssetKey:
    return dg.AssetKey(layout.round_asset(number, name))


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> DataLake:
    return DataLake(root=str(tmp_path_factory.mktemp("lake")))


@pytest.fixture(scope="module")
def instance() -> dg.DagsterInstance:
    with arms_instance() as instance:
        yield instance


@pytest.fixture(scope="module")
def config(tiny_model_dir) -> dict:
    return tiny_config(tiny_model_dir)


@pytest.fixture(scope="module")
def two_rounds(lake, instance, config) -> dict[str, dg.ExecuteInJobResult]:
    names = [*FOUNDATION, layout.BASE_MODEL_EVAL, layout.LABELED_RL_EVAL, *ROUND_1, *ROUND_2]
    results = {"arm": materialize(lake, names, config, ARM, instance)}
    results["verdict"] = materialize(lake, [layout.VERDICT], config, instance=instance)
    return results


def test_metadata_keys_and_lake_paths_are_those_of_the_snapshot(two_rounds, lake: DataLake) -> None:
    """A lake made by an earlier commit stays readable and current: every asset writes the same metadata keys and the
    same files at the same paths (tests/snapshots/tiny_run.json, written by the commit before the core/defs split)."""
    snapshot = json.loads((SNAPSHOTS / "tiny_run.json").read_text())
    metadata = {
        event.asset_key.to_user_string(): sorted(event.step_materialization_data.materialization.metadata)
        for result in two_rounds.values()
        for event in result.get_asset_materialization_events()
    }
    assert metadata == snapshot["metadata_keys"]
    root = lake.root_path
    files = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and not any(part.startswith((".", "mlflow")) for part in path.relative_to(root).parts)
    )
    assert files == snapshot["lake_files"]


def test_round_two_samples_from_round_one_student_promoted_at_a_tie(two_rounds, lake: DataLake) -> None:
    round_one_student = lake.artifact_dir(key(1, layout.STUDENT), ARM)
    labeled_rl = lake.artifact_dir(dg.AssetKey(layout.LABELED_RL), ARM)
    teacher = lake.artifact_dir(key(2, layout.TEACHER), ARM)
    first = lake.read_table(key(1, layout.GENERATIONS), ARM)
    second = lake.read_table(key(2, layout.GENERATIONS), ARM)
    assert set(first["checkpoint"]) == {f"{labeled_rl} sha256:{weights_sha256(labeled_rl)[:12]}"}
    assert set(second["checkpoint"]) == {f"{teacher} sha256:{weights_sha256(round_one_student)[:12]}"}
    assert metadata_of(two_rounds["arm"], "round_002/generations")["teacher"].value == str(teacher)
    promotion = metadata_of(two_rounds["arm"], "round_002/teacher")
    assert (promotion["promoted"].value, promotion["rule"].value) == ("student", "validation")
    assert promotion["margin"].value == 0.0, "a random model answers no validation problem: a tie, to the student"
    assert read_promotion(teacher).checkpoint == round_one_student
    report = metadata_of(two_rounds["arm"], "round_002/eval_report")
    assert report["taught_by"].value == "previous_round", "its flips count from round 1's student, its teacher"
    report_text = (lake.artifact_dir(key(2, layout.EVAL_REPORT), ARM) / f"{REPORT_NAME}.md").read_text()
    assert "**Teacher.** Round 2 is taught by round 1's student, promoted over its teacher: " in report_text
    labeled_only_two = metadata_of(two_rounds["arm"], "round_002/labeled_only_checkpoint")
    assert labeled_only_two["init_checkpoint"].value == str(lake.artifact_dir(key(1, "labeled_only_checkpoint"), ARM))


def test_a_student_worse_than_its_teacher_on_validation_is_not_promoted(two_rounds, lake, instance, config) -> None:
    """Labeled RL scored above round 1's student on the validation problems (its published eval says so here): round
    2's teacher is labeled RL, and round 2 samples from it, through the promotion asset; under the `student` rule
    (the arm field `promotion`'s setting) the worse student teaches all the same."""
    labeled_rl = lake.artifact_dir(dg.AssetKey(layout.LABELED_RL), ARM)
    metrics_file = lake.artifact_dir(dg.AssetKey(layout.LABELED_RL_VALIDATION), ARM) / layout.METRICS_FILE
    recorded = metrics_file.read_text()
    better = json.loads(recorded)
    better["metrics"]["greedy_accuracy"] = 0.5
    metrics_file.unlink()  # a new file: a published one may be a hard link to another artifact's
    metrics_file.write_text(json.dumps(better))
    promoted = round_names(2, layout.TEACHER, layout.GENERATIONS)
    always_the_student = {"ops": config["ops"] | {op("round_002", layout.TEACHER): {"config": {"rule": "student"}}}}
    teacher = lake.artifact_dir(key(2, layout.TEACHER), ARM)
    try:
        promotion = metadata_of(materialize(lake, promoted, config, ARM, instance), "round_002/teacher")
        decided, teacher_sha, compute = read_promotion(teacher), weights_sha256(teacher), read_compute(teacher).total
        samples = lake.read_table(key(2, layout.GENERATIONS), ARM)
        student_rule = metadata_of(materialize(lake, promoted[:1], always_the_student, ARM, instance), promoted[0])
    finally:
        metrics_file.unlink()
        metrics_file.write_text(recorded)
    assert (promotion["promoted"].value, promotion["margin"].value) == ("teacher", -0.5)
    assert decided.checkpoint == labeled_rl and teacher_sha == weights_sha256(labeled_rl)
    assert set(samples["checkpoint"]) == {f"{teacher} sha256:{teacher_sha[:12]}"}
    assert compute == read_compute(lake.artifact_dir(key(1, layout.STUDENT), ARM)).total, (
        "round 1's student was trained all the same"
    )
    assert (student_rule["promoted"].value, student_rule["margin"].value) == ("student", -0.5)
    materialize(lake, promoted, config, ARM, instance)  # back to the student promoted at a tie
    assert read_promotion(teacher).promoted == "student"


def test_round_artifacts_reports_and_checks(two_rounds, lake: DataLake) -> None:
    generations = lake.read_table(key(1, layout.GENERATIONS), ARM)
    assert generations.height == 6 * 3 and set(generations["sample_index"]) == {0, 1, 2}
    labels = lake.read_table(key(1, layout.PSEUDO_LABELS), ARM)
    assert labels.height == 6 and "hidden_gold_answer" not in labels.columns
    for number in (1, 2):
        metrics = json.loads((lake.artifact_dir(key(number, layout.EVAL_REPORT), ARM) / "metrics.json").read_text())[
            "metrics"
        ]
        assert 0.0 <= metrics["greedy_accuracy"] <= 1.0 and "pass@2" in metrics and "maj@2" in metrics
        assert "delta_vs_labeled_rl/greedy_accuracy" in metrics and "verdict/difference" in metrics
    second = json.loads((lake.artifact_dir(key(2, layout.EVAL_REPORT), ARM) / "metrics.json").read_text())
    assert "delta_vs_previous_round/greedy_accuracy" in second["metrics"]
    report = (lake.artifact_dir(key(2, layout.EVAL_REPORT), ARM) / f"{REPORT_NAME}.md").read_text()
    assert "**Verdict.** round_002 (arm a)" in report and "its labeled-only control" in report and "95% CI" in report
    checks = two_rounds["arm"].get_asset_check_evaluations()
    names = {(c.asset_key.to_user_string(), c.check_name) for c in checks}
    assert {
        ("round_001/pseudo_labels", "pseudo_label_quality"),
        ("round_002/eval_report", "no_eval_regression"),
    } <= names
    for control in layout.DEFAULT_CONTROLS:
        assert (f"round_001/{control}_checkpoint", "compute_matched") in names
        assert (f"round_001/{control}_checkpoint", "smoke_generation") in names
    assert all(c.passed for c in checks if c.check_name != "no_eval_regression")


def test_a_round_and_its_labeled_only_control_spent_the_same_compute(two_rounds, lake: DataLake) -> None:
    for number in (1, 2):
        student = metadata_of(two_rounds["arm"], f"round_00{number}/student_checkpoint")
        control = metadata_of(two_rounds["arm"], f"round_00{number}/labeled_only_checkpoint")
        for field in MATCHED_FIELDS:
            assert student[f"compute/total_{field}"].value == control[f"compute/total_{field}"].value
        # Labeled RL's one step, then one step a round (TINY_GRPO: 2 prompts x 2 completions a step).
        assert student["compute/total_optimizer_steps"].value == 1 + number
        assert student["compute/total_completions"].value == 4 * (1 + number)


def test_a_control_trained_longer_fails_the_compute_match(two_rounds, lake, instance, config) -> None:
    longer = with_op_config(
        config,
        op("round_001", "labeled_only_checkpoint"),
        grpo=TINY_GRPO | {"max_steps": 2},
    )
    result = materialize(lake, round_names(1, "labeled_only_checkpoint"), longer, ARM, instance, raise_on_error=False)
    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "compute_matched"]
    assert not check.passed and "optimizer_steps 3 != 2" in check.description
    materialize(lake, round_names(1, "labeled_only_checkpoint"), config, ARM, instance)  # back to the matched control


def test_a_control_trained_another_way_fails_the_compute_match(two_rounds, lake, instance, config) -> None:
    """The same steps, prompts and completions at another learning rate and LoRA rank: only the data may differ."""
    other_recipe = with_op_config(
        config, op("round_001", "labeled_only_checkpoint"), grpo=TINY_GRPO | {"learning_rate": 1e-3, "lora_r": 4}
    )
    result = materialize(
        lake, round_names(1, "labeled_only_checkpoint"), other_recipe, ARM, instance, raise_on_error=False
    )
    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "compute_matched"]
    assert not check.passed, check.description
    assert "learning_rate 0.001 != 0.0002" in check.description and "lora_r 4 != 16" in check.description
    assert (
        "optimizer_steps" not in check.description
        and "completion tokens generated since the base model" in check.description
    )
    materialize(lake, round_names(1, "labeled_only_checkpoint"), config, ARM, instance)  # back to the matched control


def test_a_cap_from_the_teacher_s_samples_is_the_student_s_and_every_control_s(two_rounds, lake, instance, config):
    """With `grpo.completion_cap_margin`, the round's student and its three controls train with one cap: the round's
    teacher samples' 99th percentile length plus the margin (the tiny model's samples run to their 8 tokens: 8 + 2),
    recorded as each one's `max_completion_length`, and their compute still matches."""
    trainers = [layout.STUDENT, *(layout.control_checkpoint(control) for control in layout.DEFAULT_CONTROLS)]
    capped = config
    for name in trainers:
        capped = with_op_config(
            capped, op("round_001", name), grpo=TINY_GRPO | {"max_completion_length": 32, "completion_cap_margin": 2}
        )
    teacher_tokens = lake.read_table(key(1, layout.GENERATIONS), ARM)["n_tokens"]

    result = materialize(lake, round_names(1, *trainers), capped, ARM, instance)

    expected = min(32, teacher_tokens.sort()[math.ceil(0.99 * teacher_tokens.len()) - 1] + 2)
    assert expected < 32
    for name in trainers:
        metadata = metadata_of(result, f"round_001/{name}")
        assert metadata["completion_cap"].value == expected, name
        assert metadata["grpo_settings"].value["max_completion_length"] == expected, name
    matched = [check for check in result.get_asset_check_evaluations() if check.check_name == COMPUTE_MATCHED]
    assert len(matched) == len(layout.DEFAULT_CONTROLS) and all(check.passed for check in matched)
    materialize(lake, round_names(1, *trainers), config, ARM, instance)  # back to the fixed cap


def _compute_matched_alone(control: dg.AssetKey, lake: DataLake, instance) -> dg.ExecuteInJobResult:
    """The control's compute_matched check run alone on the arm's lake as it is."""
    (check_def,) = [d for d in ASSETS_AND_CHECKS if dg.AssetCheckKey(control, COMPUTE_MATCHED) in d.check_keys]
    return defs.resolve_implicit_global_asset_job_def().execute_in_process(
        op_selection=[check_def.node_def.name],
        partition_key=ARM,
        instance=instance,
        resources=isolated_resources(lake, "inprocess"),
        raise_on_error=False,
    )


def test_checkpoints_without_recorded_compute_fail_the_compute_match(two_rounds, lake, instance) -> None:
    """A missing compute.json reads as nothing spent (the base model's case): two trained checkpoints without one
    must fail the match, not pass it as equal."""
    control = key(1, layout.control_checkpoint(layout.LABELED_ONLY))
    records = [lake.artifact_dir(name, ARM) / layout.COMPUTE_FILE for name in (control, key(1, layout.STUDENT))]
    kept = [record.read_bytes() for record in records]
    for record in records:
        record.unlink()
    try:
        result = _compute_matched_alone(control, lake, instance)
    finally:
        for record, content in zip(records, kept, strict=True):
            record.write_bytes(content)
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed
    assert "no recorded compute (compute.json) in the control and the student checkpoint" in check.description


def test_a_control_trained_before_its_student_is_not_judged_and_not_stopped(two_rounds, lake, instance) -> None:
    """The controls trained alone (`grid run --through` their evals): with no student to match, the check does not
    pass, and warns instead of blocking the control's eval."""
    control = key(1, layout.control_checkpoint(layout.LABELED_ONLY))
    student = lake.artifact_dir(key(1, layout.STUDENT), ARM)
    aside = student.with_name(f"{student.name}.aside")
    student.rename(aside)
    try:
        result = _compute_matched_alone(control, lake, instance)
    finally:
        aside.rename(student)
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN and result.success
    assert check.description.startswith("the round's student is not trained yet")


def test_mlflow_runs_are_named_and_tagged_with_arm_round_and_role_and_a_round_filter_finds_them(
    two_rounds, lake: DataLake
) -> None:
    mlflow.set_tracking_uri(MlflowTracking(lake=lake).resolved_tracking_uri)
    runs = [  # the assets' runs (an arm's own run holds its accuracy by round)
        r
        for r in mlflow.search_runs(experiment_names=["noisy-student"], output_format="list")
        if r.data.tags.get(ROLE_TAG) != ARM_ROLE
    ]
    arms = [r for r in runs if r.data.tags.get(ARM_TAG) == ARM]
    seen = {(r.data.tags["dagster.asset"], r.data.tags[ROUND_TAG], r.data.tags[ROLE_TAG]) for r in arms}
    assert ("round_001/student_checkpoint", "round_001", "student") in seen
    assert ("round_002/labeled_only_eval", "round_002", "labeled_only") in seen
    assert ("round_001/random_label_checkpoint", "round_001", "random_label") in seen
    names = {r.data.tags["dagster.asset"]: r.info.run_name for r in arms}
    assert names["round_002/eval_report"] == f"r2 eval student {ARM}"
    assert names["round_002/labeled_only_checkpoint"] == f"r2 ckpt labeled-only {ARM}"
    assert names[layout.LABELED_RL] == f"ckpt labeled-rl {ARM}"
    # Flat: MLflow's table shows a parent run collapsed, even under a filter that matches its children.
    assert not [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    round_2 = mlflow.search_runs(
        experiment_names=["noisy-student"], filter_string="tags.round = 'round_002'", output_format="list"
    )
    assert {r.info.run_id for r in round_2} == {
        r.info.run_id for r in runs if r.data.tags["dagster.asset"].startswith("round_002/")
    }
    by_name = mlflow.search_runs(
        experiment_names=["noisy-student"], filter_string="attributes.run_name LIKE 'r2 %'", output_format="list"
    )
    assert {r.info.run_id for r in by_name} == {r.info.run_id for r in round_2}
    assert {r.data.tags["dagster.asset"] for r in runs if ARM_TAG not in r.data.tags} == {layout.VERDICT}
    assert {layout.PROBLEM_POOL, layout.BASE_MODEL, layout.BASE_MODEL_EVAL} <= {asset for asset, _, _ in seen}
    metadata = metadata_of(two_rounds["arm"], layout.LABELED_RL)
    trained = mlflow.get_run(metadata["mlflow_run_id"].value)
    assert trained.data.tags["dagster.run_id"] == two_rounds["arm"].run_id
    assert "arm.max_rounds" in trained.data.params, "an arm's run holds the arm's spec (tests/experiments/tests.yaml)"
    assert any(key.startswith(("train", "reward")) for key in trained.data.metrics)
    assert trained.data.params["config.grpo.max_steps"] == "1" and "compute/total_completions" in trained.data.metrics
    # MLflow's Compare view opens on a run's first-logged metric: an eval's accuracy, its timing last.
    evaluated = [list(r.data.metrics) for r in arms if {"greedy_accuracy", "eval_seconds"} <= set(r.data.metrics)]
    assert evaluated, "an evaluation ran (not reused) and was timed"
    assert all(order.index("greedy_accuracy") < order.index("eval_seconds") == len(order) - 1 for order in evaluated)


def test_an_arm_s_own_run_holds_each_checkpoint_s_accuracy_by_round(two_rounds, lake: DataLake) -> None:
    """What MLflow's chart view draws as accuracy by round, a line per arm: the lake's evaluations, stepped by round,
    labeled RL as round 0 of the student's line."""
    mlflow.set_tracking_uri(MlflowTracking(lake=lake).resolved_tracking_uri)
    (arm_run,) = mlflow.search_runs(
        experiment_names=["noisy-student"],
        filter_string=f"tags.{ROLE_TAG} = '{ARM_ROLE}' and tags.{ARM_TAG} = '{ARM}'",
        output_format="list",
    )
    client, arm_lake = mlflow.MlflowClient(), ArmLake(lake.root_path, ARM)

    def points(metric: str) -> dict[int, float]:
        return {point.step: point.value for point in client.get_metric_history(arm_run.info.run_id, metric)}

    def history(line: str) -> dict[int, float]:
        return points(f"{BY_ROUND}/{line}")

    def accuracy(evaluation) -> float:
        return evaluation.metrics["greedy_accuracy"]

    labeled_rl = accuracy(arm_lake.evaluation(layout.LABELED_RL_EVAL))
    assert history(layout.STUDENT_ROLE) == {0: labeled_rl} | {
        number: accuracy(arm_lake.round_evaluation(number, layout.STUDENT_ROLE)) for number in (1, 2)
    }
    assert history(layout.LABELED_ONLY) == {
        number: accuracy(arm_lake.round_evaluation(number, layout.LABELED_ONLY)) for number in (1, 2)
    }
    assert history("labeled_rl") == {0: labeled_rl}
    assert history(layout.BASE_MODEL) == {0: accuracy(arm_lake.evaluation(layout.BASE_MODEL_EVAL))}
    assert arm_run.info.status == "FINISHED" and arm_run.data.tags[EXPERIMENT_TAG] == "tests"
    # The verdict's difference from each control, with its interval, beside the accuracy (of the arm's group).
    verdict = lake.artifact_dir(dg.AssetKey(layout.VERDICT))
    (group,) = pl.read_parquet(verdict / "accuracy.parquet").filter(pl.col("arm") == ARM)["group"].unique()
    differences = pl.read_parquet(verdict / "differences.parquet").filter(
        pl.col("experiment") == "tests", pl.col("group") == group, pl.col("eval_set") == ALL_EVAL
    )
    assert layout.LABELED_ONLY in set(differences["control"])
    for control in set(differences["control"]):
        rows = differences.filter(pl.col("control") == control)
        for column, suffix in (("estimate", ""), ("low", "/low"), ("high", "/high")):
            assert points(f"{DIFFERENCE}/{control}{suffix}") == dict(zip(rows["round"], rows[column], strict=True))


def test_dagster_and_mlflow_link_each_other(two_rounds, lake: DataLake) -> None:
    mlflow.set_tracking_uri(MlflowTracking(lake=lake).resolved_tracking_uri)
    experiment = mlflow.get_experiment_by_name("noisy-student")
    metadata = metadata_of(two_rounds["arm"], "round_001/student_checkpoint")
    run = mlflow.get_run(metadata["mlflow_run_id"].value)
    # The model-training view: MLflow's UI otherwise opens on GenAI traces, where training runs do not show.
    run_page = f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}?workflowType=machine_learning"
    assert metadata["mlflow_run"].value == run_page
    dagster_run_url = f"http://127.0.0.1:3000/runs/{two_rounds['arm'].run_id}"
    assert run.data.tags[DAGSTER_RUN_URL_TAG] == dagster_run_url
    assert (
        f"]({dagster_run_url})" in run.data.tags[NOTE_TAG]
        and "](http://127.0.0.1:3000/assets/round_001/student_checkpoint)" in run.data.tags[NOTE_TAG]
    )


def test_no_log_or_metadata_shows_the_tracking_uri(two_rounds, lake: DataLake, instance) -> None:
    uri = MlflowTracking(lake=lake).resolved_tracking_uri
    for result in two_rounds.values():
        for entry in instance.all_logs(result.run_id):
            assert uri not in f"{entry.message} {entry.dagster_event!r}"
    assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"  # a remote store's URL stays off stdout


def test_controls_train_on_their_own_labels(two_rounds, lake: DataLake) -> None:
    gold = metadata_of(two_rounds["arm"], "round_001/gold_label_checkpoint")
    assert (gold["gold_rows"].value, gold["pseudo_rows"].value) == (4 + 6, 0)
    assert gold["init_checkpoint"].value == str(lake.artifact_dir(dg.AssetKey(layout.LABELED_RL), ARM))
    labeled_only = metadata_of(two_rounds["arm"], "round_001/labeled_only_checkpoint")
    assert (labeled_only["gold_rows"].value, labeled_only["pseudo_rows"].value) == (4, 0)
    for control in layout.DEFAULT_CONTROLS:
        assert (lake.artifact_dir(key(1, f"{control}_eval"), ARM) / "metrics.json").is_file()


FIGURES = ("accuracy_by_round", "agreement_histogram", "label_accuracy_vs_agreement", "label_frontier")


def test_round_report_has_figures_calibration_flips_frontier_and_the_accuracy_by_round(
    two_rounds, lake: DataLake
) -> None:
    report = lake.artifact_dir(key(2, layout.EVAL_REPORT), ARM)
    text = (report / f"{REPORT_NAME}.md").read_text()
    assert (
        "## Pseudo-label calibration" in text and "| [0.9, 1.0] |" in text and "## Compute since the base model" in text
    )
    assert (
        "**Flips from the teacher.**" in text
        and "## Flips from the teacher" in text
        and "## Label sources at matched coverage" in text
    )
    accuracy = pl.read_parquet(report / "accuracy_per_round_and_chain.parquet")
    assert accuracy.select("round", "checkpoint").rows() == [
        (0, "base_model"),
        (0, "student"),
        (0, "labeled_only"),
        (1, "student"),
        (1, "labeled_only"),
        (2, "student"),
        (2, "labeled_only"),
    ]
    metadata = metadata_of(two_rounds["arm"], "round_002/eval_report")
    for figure in FIGURES:
        assert (report / f"{figure}.png").read_bytes().startswith(b"\x89PNG")
        assert metadata[figure].value.startswith(f"![{figure}](data:image/png;base64,")
    mlflow.set_tracking_uri(MlflowTracking(lake=lake).resolved_tracking_uri)
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(metadata["mlflow_run_id"].value, "eval_report")}
    assert {f"eval_report/{figure}.png" for figure in FIGURES} | {"eval_report/report.html"} <= artifacts
    # The figures show where a person reads the report: inlined in Dagster's metadata and in the HTML page
    # MLflow renders; only the lake's report.md links the PNG files beside it.
    assert "![accuracy_by_round](accuracy_by_round.png)" in text
    for inline in (metadata["report"].value, (report / "report.html").read_text()):
        assert "accuracy_by_round.png)" not in inline and inline.count("data:image/png;base64,") == len(FIGURES)
    assert "<table>" in (report / "report.html").read_text()
    # The UI plots every float: the deltas against other checkpoints are one JSON entry, not a dozen charts.
    assert not [name for name in metadata if name.startswith("delta_vs_")]
    assert "delta_vs_previous_round/greedy_accuracy" in metadata["deltas"].value and "greedy_accuracy" in metadata


def test_the_verdict_compares_every_round_with_its_controls(two_rounds, lake: DataLake) -> None:
    verdict = lake.artifact_dir(dg.AssetKey(layout.VERDICT))
    differences = pl.read_parquet(verdict / "differences.parquet")
    assert differences.select("round", "control").rows() == [
        (1, "labeled_only"),
        (1, "gold_label"),
        (1, "random_label"),
        (2, "labeled_only"),
    ]
    assert differences["compute_matched"].all() and (differences["seeds"] == 1).all()
    text = (verdict / "verdict.md").read_text()
    assert "**tests, defaults**: round 2 (defaults)" in text and "its labeled-only control" in text
    assert (verdict / "accuracy_by_round.png").read_bytes().startswith(b"\x89PNG")


def test_a_new_tau_relabels_without_sampling(two_rounds, lake, instance, config) -> None:
    path = lake.artifact_dir(key(2, layout.GENERATIONS), ARM) / "data.parquet"
    before = path.stat().st_mtime_ns
    relabel = with_op_config(config, op("round_002", layout.PSEUDO_LABELS), tau=0.9)
    result = materialize(
        lake,
        round_names(2, layout.PSEUDO_LABELS, layout.STUDENT, "labeled_only_eval", layout.EVAL_REPORT),
        relabel,
        ARM,
        instance,
    )
    steps = {event.step_key for event in result.all_events if event.is_step_success}
    assert "round_002__pseudo_labels" in steps and not any("generations" in step for step in steps)
    assert metadata_of(result, "round_002/pseudo_labels")["tau"].value == 0.9
    assert path.stat().st_mtime_ns == before


def test_an_arm_with_the_same_inputs_reuses_samples_and_training(two_rounds, lake, instance, config) -> None:
    """Arm c differs from a only by tau: its split, labeled RL and round-1 samples are a's, read back, not redone."""
    instance.add_dynamic_partitions("arm", ["c"])
    result = materialize(lake, [*FOUNDATION, *round_names(1, layout.GENERATIONS)], config, "c", instance)
    labeled_rl = metadata_of(result, layout.LABELED_RL)
    # The tiny random model's zero rewards leave weights unchanged, so arm a's later runs are the same run too.
    assert labeled_rl["reused_from"].value.endswith(f"/{ARM}") and "training_seconds" not in labeled_rl
    generations = metadata_of(result, "round_001/generations")
    assert generations["reused_cached_samples"].value is True and "sampling_seconds" not in generations
    reused, original = (lake.read_table(key(1, layout.GENERATIONS), arm) for arm in ("c", ARM))
    assert reused.drop("checkpoint").equals(original.drop("checkpoint"))
    teacher = lake.artifact_dir(dg.AssetKey(layout.LABELED_RL), "c")
    assert set(reused["checkpoint"]) == {f"{teacher} sha256:{weights_sha256(teacher)[:12]}"}


def test_a_failed_label_floor_stops_the_round_before_training(two_rounds, lake, instance, config) -> None:
    floor = with_op_config(config, op("round_002", layout.PSEUDO_LABELS), tau=1.0, min_coverage=1.0)
    instance.add_dynamic_partitions("arm", ["b"])
    materialize(
        lake, [*FOUNDATION, layout.LABELED_RL_EVAL, *round_chain(1, layout.LABELED_ONLY)], config, "b", instance
    )
    promotion = [layout.LABELED_RL_VALIDATION, *round_names(1, layout.STUDENT_VALIDATION)]
    names = promotion + round_names(2, layout.TEACHER, layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT)
    result = materialize(lake, names, floor, "b", instance, raise_on_error=False)
    assert not result.success
    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "pseudo_label_quality"]
    assert not check.passed and check.description.startswith("tau=1.0 keeps")
    assert lake.artifact_dir(key(2, layout.PSEUDO_LABELS), "b").exists()
    assert not lake.artifact_dir(key(2, layout.STUDENT), "b").exists()
    # A run of the student alone refuses the labels too.
    alone = materialize(lake, round_names(2, layout.STUDENT), config, "b", instance, raise_on_error=False)
    failure = next(e for e in alone.all_events if e.event_type_value == "STEP_FAILURE")
    assert "failed its quality floor: tau=1.0 keeps" in failure.event_specific_data.error.message
    assert not lake.artifact_dir(key(2, layout.STUDENT), "b").exists()


def test_a_round_job_launched_for_an_arm_makes_only_what_its_experiment_asks_for(
    two_rounds, lake, instance, config
) -> None:
    """`round_001_job` from the UI selects the whole round whichever arm is picked: for an arm of an experiment that
    lists the labeled-only control alone (tests/experiments/grid.yaml), the other controls skip, and with them their
    evaluations and checks."""
    from noisy_student_assets.core.experiments.arms import load_experiments
    from noisy_student_assets.core.experiments.progress import round_assets
    from noisy_student_assets.definitions import defs
    from tests.conftest import TEST_EXPERIMENTS

    job = defs.resolve_job_def("round_001_job")
    selection = sorted(key.to_user_string() for key in job.asset_layer.selected_asset_keys)
    assert set(
        round_names(1, layout.control_checkpoint(layout.GOLD_LABEL), layout.control_checkpoint(layout.RANDOM_LABEL))
    ) <= set(selection)
    instance.add_dynamic_partitions("arm", ["g"])
    materialize(lake, [*FOUNDATION, layout.LABELED_RL_EVAL], config, "g", instance)
    result = materialize(lake, selection, config, "g", instance)

    experiment = load_experiments(TEST_EXPERIMENTS)["grid"]
    made = {event.asset_key.to_user_string() for event in result.get_asset_materialization_events()}
    assert made == set(round_assets(1, experiment, experiment.arm("g")))
    skipped = {event.step_key for event in result.all_events if event.event_type_value == "STEP_SKIPPED"}
    assert {
        op("round_001", layout.control_eval(control)) for control in (layout.GOLD_LABEL, layout.RANDOM_LABEL)
    } <= skipped
    logs = "\n".join(record.user_message for record in instance.all_logs(result.run_id))
    assert (
        f"skipped: experiment grid does not ask for {round_names(1, layout.control_checkpoint(layout.GOLD_LABEL))[0]} "
        "for arm g" in logs
    )
