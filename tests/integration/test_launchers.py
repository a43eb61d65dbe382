"""The heavy stages as payload processes (`subprocess` launcher, Dagster Pipes): the same artifacts as in process,
training on two torchrun ranks at matched compute, and faults through the boundary (a payload that raises, a
step guard's abort, a payload or a rank killed, an evaluation killed mid-way): the step fails naming the stage and
the cause, nothing is published, the retry resumes, and no process is left behind."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import dagster as dg
import mlflow
import polars as pl
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.checkpoints import weights_sha256
from noisy_student_assets.core.training.compute import MATCHED_FIELDS, read_compute
from resources.data_lake import INDEX_DIR_NAME, DataLake
from resources.tracking import MlflowTracking
from tests.faults import failures, fresh, leftovers, retries
from tests.killed_run import PAYLOAD_FAULT, kill_at, materialization
from tests.lakes import arms_instance, materialize, metadata_of
from tests.tiny_configs import RANDOM_MODEL_OUTPUT, TINY_GRPO, op, round_chain, round_names, tiny_config, with_op_config

ARM = "a"
STUDENT = "/".join(layout.round_asset(1, layout.STUDENT))
CONTROL = "/".join(layout.round_asset(1, layout.control_checkpoint(layout.LABELED_ONLY)))
STUDENT_OP = op(layout.round_prefix(1), layout.STUDENT)
ROUND = round_chain(1, layout.LABELED_ONLY)


@pytest.fixture(scope="module")
def both_launchers(
    sevens_teacher_lake: Path, sevens_model_dir: Path, tmp_path_factory
) -> dict[str, tuple[DataLake, dg.ExecuteInJobResult, list[str]]]:
    """Labeled RL (2 steps), its eval and round 1 with its labeled-only control, once in process, once as payloads:
    each lake, run and run log."""
    config = with_op_config(tiny_config(sevens_model_dir), layout.LABELED_RL, grpo=TINY_GRPO | {"max_steps": 2})
    runs = {}
    for launcher in ("inprocess", "subprocess"):
        root = tmp_path_factory.mktemp(launcher) / "lake"
        shutil.copytree(sevens_teacher_lake, root)
        shutil.rmtree(root / INDEX_DIR_NAME, ignore_errors=True)
        lake = DataLake(root=str(root))
        with arms_instance() as instance:
            result = materialize(
                lake, [layout.LABELED_RL, layout.LABELED_RL_EVAL, *ROUND], config, ARM, instance, launcher=launcher
            )
            runs[launcher] = lake, result, [entry.user_message for entry in instance.all_logs(result.run_id)]
    return runs


def test_payloads_make_the_artifacts_the_dagster_process_makes(both_launchers) -> None:
    (inprocess, *_), (subprocess_lake, *_) = both_launchers["inprocess"], both_launchers["subprocess"]
    for name in (layout.LABELED_RL, STUDENT, CONTROL):
        key = dg.AssetKey(name.split("/"))
        assert weights_sha256(inprocess.artifact_dir(key, ARM)) == weights_sha256(
            subprocess_lake.artifact_dir(key, ARM)
        ), name
    for name in ("generations", "pseudo_labels"):
        key = dg.AssetKey(layout.round_asset(1, name))
        tables = [
            lake.read_table(key, ARM).drop("checkpoint", strict=False) for lake in (inprocess, subprocess_lake)
        ]  # the teacher's path
        assert tables[0].equals(tables[1]), name
    for name in (
        layout.LABELED_RL_EVAL,
        "/".join(layout.round_asset(1, layout.EVAL_REPORT)),
        "/".join(layout.round_asset(1, "labeled_only_eval")),
    ):
        key = dg.AssetKey(name.split("/"))
        scores = [
            pl.read_parquet(lake.artifact_dir(key, ARM) / "scores.parquet") for lake in (inprocess, subprocess_lake)
        ]
        assert scores[0].equals(scores[1]), name


def test_the_payloads_progress_and_trl_step_metrics_reach_the_run_log_and_mlflow(both_launchers) -> None:
    lake, result, messages = both_launchers["subprocess"]
    assert any("sampled 6/6 problems" in message for message in messages)
    assert any(message.startswith("step 1/1: {") and "'loss'" in message for message in messages)
    assert any("eval: 5/10 problem passes" in message for message in messages)
    mlflow.set_tracking_uri(MlflowTracking(lake=lake).resolved_tracking_uri)
    run_id = metadata_of(result, layout.LABELED_RL)["mlflow_run_id"].value
    history = mlflow.MlflowClient().get_metric_history(run_id, "loss")
    assert [point.step for point in history] == [1, 2]


def test_a_payload_that_raises_fails_its_step_with_its_own_error(sevens_lake_copy, sevens_model_dir, fault) -> None:
    lake = fresh(sevens_lake_copy)
    fault("")
    # sft rows of 6 kept problems can fill no step of 4 problems x 2 completions... of 100 prompts a step
    config = with_op_config(
        tiny_config(sevens_model_dir), STUDENT_OP, mode="sft", grpo=TINY_GRPO | {"prompts_per_step": 100}
    )
    result = materialize(
        lake,
        round_names(1, layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT),
        config,
        ARM,
        raise_on_error=False,
        launcher="subprocess",
    )
    (failure,) = failures(result, STUDENT_OP)
    assert "stage train failed: ValueError:" in failure and "cannot fill a step of 200 completions" in failure
    assert not lake.artifact_dir(dg.AssetKey(STUDENT.split("/")), ARM).exists()


@pytest.mark.long
def test_a_step_guard_abort_in_a_payload_fails_its_step_and_publishes_nothing(
    sevens_lake_copy, sevens_model_dir, fault
) -> None:
    lake = fresh(sevens_lake_copy)
    fault("nonfinite")
    shutil.rmtree(lake.artifact_dir(dg.AssetKey(layout.LABELED_RL), ARM))
    config = with_op_config(
        tiny_config(sevens_model_dir), layout.LABELED_RL, grpo=TINY_GRPO | {"max_steps": 4, "save_steps": 0}
    )
    result = materialize(lake, [layout.LABELED_RL], config, ARM, raise_on_error=False, launcher="subprocess")
    (failure,) = failures(result, layout.LABELED_RL)
    assert (
        "stage train failed: NonFiniteTrainingError: training stopped at step 3: 3 consecutive optimizer steps"
        in failure
    )
    assert not lake.artifact_dir(dg.AssetKey(layout.LABELED_RL), ARM).exists()


def test_a_killed_training_payload_fails_its_attempt_and_the_retry_resumes(
    sevens_lake_copy, sevens_model_dir, fault
) -> None:
    lake = fresh(sevens_lake_copy)
    fault("kill-after-checkpoint")
    config = with_op_config(tiny_config(sevens_model_dir), layout.LABELED_RL, grpo=TINY_GRPO | {"max_steps": 2})
    result = materialize(lake, [layout.LABELED_RL], config, ARM, launcher="subprocess")
    (retried,) = retries(result, layout.LABELED_RL)
    assert "stage train failed: the payload was killed by SIGKILL" in retried
    assert metadata_of(result, layout.LABELED_RL)["resumed_from_step"].value == 1.0


def test_a_payload_killed_while_saving_a_checkpoint_has_its_retry_set_it_aside_and_say_so(
    sevens_lake_copy, sevens_model_dir, fault
) -> None:
    """What a payload set aside reaches the asset's metadata through Pipes."""
    lake = fresh(sevens_lake_copy)
    fault("kill-in-checkpoint-save")
    config = with_op_config(tiny_config(sevens_model_dir), layout.LABELED_RL, grpo=TINY_GRPO | {"max_steps": 3})
    result = materialize(lake, [layout.LABELED_RL], config, ARM, launcher="subprocess")
    (retried,) = retries(result, layout.LABELED_RL)
    assert "stage train failed: the payload was killed by SIGKILL" in retried
    metadata = metadata_of(result, layout.LABELED_RL)
    assert metadata["resumed_from_step"].value == 1.0
    (set_aside,) = metadata["set_aside"].value
    assert set_aside.startswith("checkpoint-2 was incomplete (") and set_aside.endswith("resumed from checkpoint-1")


def test_a_payload_left_running_by_a_killed_dagster_process_is_stopped_before_the_retry(
    lake_copy, tiny_model_dir, fault
) -> None:
    lake = fresh(lake_copy)
    kill_at(
        PAYLOAD_FAULT, lake, tiny_model_dir
    )  # SIGKILLs the Dagster process's group; the payload has a session of its own
    marker = os.environ["NOISY_STUDENT_TEST_MARKER"]
    assert leftovers(marker), "the payload outlives its killed Dagster process"
    selection, config, arm = materialization(PAYLOAD_FAULT, str(tiny_model_dir))
    with arms_instance() as instance:
        result = materialize(lake, selection, config, arm, instance, launcher="subprocess")
        messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any(message.startswith("stopping payload process group") for message in messages)
    assert leftovers(marker) == []
    assert metadata_of(result, layout.LABELED_RL)["resumed_from_step"].value == 1.0


@pytest.mark.long
def test_a_rank_that_dies_fails_the_attempt_and_the_retry_resumes_on_two_ranks(
    sevens_lake_copy, sevens_model_dir, fault
) -> None:
    lake = fresh(sevens_lake_copy)
    fault("kill-rank-1-after-checkpoint")
    config = with_op_config(
        tiny_config(sevens_model_dir), layout.LABELED_RL, grpo=TINY_GRPO | {"max_steps": 2, "processes": 2}
    )
    result = materialize(lake, [layout.LABELED_RL], config, ARM, launcher="subprocess")
    (retried,) = retries(result, layout.LABELED_RL)
    assert "stage train failed: rank 1 was killed by SIGKILL" in retried
    metadata = metadata_of(result, layout.LABELED_RL)
    assert metadata["resumed_from_step"].value == 1.0 and metadata["compute/optimizer_steps"].value == 2


@pytest.mark.long
def test_an_evaluation_killed_midway_resumes_from_its_shards_with_the_same_scores(
    sevens_lake_copy, sevens_model_dir, fault
) -> None:
    greedy = {
        "backend": "transformers",
        "max_new_tokens": 8,
        "samples": 0,
        "ks": [],
        "shard_size": 2,
    } | RANDOM_MODEL_OUTPUT
    config = with_op_config(tiny_config(sevens_model_dir), layout.LABELED_RL_EVAL, **greedy)
    whole = fresh(sevens_lake_copy)
    materialize(whole, [layout.LABELED_RL_EVAL], config, ARM, launcher="subprocess")
    lake = fresh(sevens_lake_copy)
    fault("kill-after-shard")
    result = materialize(lake, [layout.LABELED_RL_EVAL], config, ARM, launcher="subprocess")
    (retried,) = retries(result, layout.LABELED_RL_EVAL)
    assert "stage evaluate failed: the payload was killed by SIGKILL" in retried
    assert metadata_of(result, layout.LABELED_RL_EVAL)["resumed_problem_passes"].value == 2
    key = dg.AssetKey(layout.LABELED_RL_EVAL)
    scores = [pl.read_parquet(lake_.artifact_dir(key, ARM) / "scores.parquet") for lake_ in (whole, lake)]
    assert scores[0].equals(scores[1])


def test_a_two_process_student_spends_its_one_process_control_s_compute(sevens_lake_copy, sevens_model_dir) -> None:
    lake = fresh(sevens_lake_copy)
    config = tiny_config(sevens_model_dir)
    config = with_op_config(config, STUDENT_OP, grpo=TINY_GRPO | {"max_steps": 2, "processes": 2})
    control_op = op(layout.round_prefix(1), layout.control_checkpoint(layout.LABELED_ONLY))
    config = with_op_config(config, control_op, grpo=TINY_GRPO | {"max_steps": 2})
    selection = round_names(
        1, layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT, layout.control_checkpoint(layout.LABELED_ONLY)
    )
    result = materialize(lake, selection, config, ARM, launcher="subprocess")
    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "compute_matched"]
    assert check.passed
    student, control = (
        read_compute(lake.artifact_dir(dg.AssetKey(name.split("/")), ARM)).own for name in (STUDENT, CONTROL)
    )
    for field in MATCHED_FIELDS:
        assert getattr(student, field) == getattr(control, field) > 0
    assert metadata_of(result, STUDENT)["grpo_settings"].value["processes"] == 2


def test_several_processes_need_the_subprocess_launcher(sevens_lake_copy, sevens_model_dir) -> None:
    lake = fresh(sevens_lake_copy)
    config = with_op_config(tiny_config(sevens_model_dir), layout.LABELED_RL, grpo=TINY_GRPO | {"processes": 2})
    result = materialize(lake, [layout.LABELED_RL], config, ARM, raise_on_error=False)
    (failure,) = failures(result, layout.LABELED_RL)
    assert "stage train asks for 2 processes: use the subprocess or ray launcher" in failure
