"""The `ray` launcher's stages on the suite's local Ray cluster (2 declared GPUs): a killed Ray job fails its
attempt and the retry resumes, a stage Ray could never place and an unreachable cluster fail at once with their
cause, and a round's sampling in three Ray jobs gives the table of one in-process run."""

from __future__ import annotations

import socket

import dagster as dg
import pytest

from noisy_student_assets.core import layout
from resources.launchers import StageLauncher
from tests.faults import failures, fresh, retries
from tests.lakes import materialize, metadata_of
from tests.tiny_configs import N_UNLABELED, TINY_GRPO, TINY_SAMPLING, op, round_names, tiny_config, with_op_config

pytestmark = pytest.mark.ray

ARM = "a"


def on_ray(address: str, **fields) -> StageLauncher:
    return StageLauncher(kind="ray", ray_address=address, **{"gpus_per_process": 1.0} | fields)


def test_a_killed_ray_job_fails_its_attempt_and_the_retry_resumes(
    sevens_lake_copy, sevens_model_dir, fault, ray_address
) -> None:
    lake = fresh(sevens_lake_copy)
    fault("kill-after-checkpoint")
    config = with_op_config(tiny_config(sevens_model_dir), layout.LABELED_RL, grpo=TINY_GRPO | {"max_steps": 2})
    result = materialize(lake, [layout.LABELED_RL], config, ARM, launcher=on_ray(ray_address))
    (retried,) = retries(result, layout.LABELED_RL)
    assert "stage train failed: the payload was killed by SIGKILL" in retried
    metadata = metadata_of(result, layout.LABELED_RL)
    assert metadata["resumed_from_step"].value == 1.0
    assert metadata["payload/cuda_visible_devices"].value in ("0", "1") and metadata["ray/job_id"].value


def test_a_stage_asking_more_gpus_than_the_cluster_has_fails_at_once(
    sevens_lake_copy, sevens_model_dir, ray_address
) -> None:
    lake = fresh(sevens_lake_copy)
    config = with_op_config(tiny_config(sevens_model_dir), layout.LABELED_RL, grpo=TINY_GRPO | {"processes": 2})
    result = materialize(
        lake, [layout.LABELED_RL], config, ARM, raise_on_error=False, launcher=on_ray(ray_address, gpus_per_process=1.5)
    )
    (failure,) = failures(result, layout.LABELED_RL)
    assert f"stage train failed: it asks Ray for 3 GPU and the cluster at {ray_address} has 2 in all" in failure
    assert retries(result, layout.LABELED_RL) == [], "a retry could not be placed either"


def test_an_unreachable_cluster_fails_naming_its_address(sevens_lake_copy, sevens_model_dir) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"http://127.0.0.1:{closed.getsockname()[1]}"  # nothing listens there once the socket is closed
    lake = fresh(sevens_lake_copy)
    result = materialize(
        lake, [layout.LABELED_RL], tiny_config(sevens_model_dir), ARM, raise_on_error=False, launcher=on_ray(address)
    )
    (failure,) = failures(result, layout.LABELED_RL)
    assert f"stage train failed: the Ray cluster at {address} is not reachable" in failure


def test_sampling_in_three_ray_jobs_gives_the_table_of_one_in_process_run(
    sevens_lake_copy, sevens_model_dir, ray_address
) -> None:
    config = with_op_config(
        tiny_config(sevens_model_dir), op(layout.round_prefix(1), layout.GENERATIONS), backend="vllm"
    )
    generations = round_names(1, layout.GENERATIONS)
    key = dg.AssetKey(layout.round_asset(1, layout.GENERATIONS))
    whole = fresh(sevens_lake_copy)
    materialize(whole, generations, config, ARM)
    sharded = fresh(sevens_lake_copy)
    result = materialize(sharded, generations, config, ARM, launcher=on_ray(ray_address, sampling_shards=3))
    parts = metadata_of(result, generations[0])["payload/parts"].value
    assert len({part["ray/job_id"] for part in parts}) == 3
    # The teacher's label names its lake's path; every sampled column is the same.
    tables = [lake.read_table(key, ARM).drop("checkpoint") for lake in (whole, sharded)]
    assert tables[0].height == N_UNLABELED * TINY_SAMPLING["k"] and tables[0].equals(tables[1])
