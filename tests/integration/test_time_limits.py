"""A heavy stage that hangs ends at its time limit, under the in-process launcher (the default) and the subprocess
one: sampling saves its first shard, starts a worker process and blocks forever (`tests/hangs.py`); in process with
vLLM's engine running too (`long`: the engine's start takes minutes on a CPU). The attempt fails naming the stage
and its limit, the worker (and the engine) are stopped with it, and the retry resumes from the shard."""

from __future__ import annotations

import os

import dagster as dg
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.sampling import SampleShards
from resources.launchers import StageLauncher
from resources.launchers.base import TERMINATION_GRACE_S
from tests.faults import leftovers, retries
from tests.hangs import hang_after_first_shard
from tests.lakes import arms_instance, materialize, metadata_of
from tests.tiny_configs import op, round_names, tiny_config, with_op_config

ARM = "a"
GENERATIONS = "/".join(layout.round_asset(1, layout.GENERATIONS))
GENERATIONS_OP = op(*layout.round_asset(1, layout.GENERATIONS))
LIMITS_S = {"inprocess": 30, "subprocess": 60, "vllm": 400}
"""Time enough to reach the hang (model load, the first shard): the subprocess payload also starts an interpreter,
vLLM its engine."""
SLACK_S = 3 * TERMINATION_GRACE_S + 60
"""What stopping the stage may take beyond its limit, generously (a loaded machine)."""


@pytest.mark.parametrize(
    ("kind", "backend"),
    [
        ("inprocess", "transformers"),
        ("subprocess", "transformers"),
        pytest.param("inprocess", "vllm", marks=pytest.mark.long),
    ],
)
def test_a_hung_stage_fails_at_its_time_limit_leaves_no_process_and_is_retried(
    kind, backend, lake_copy, tiny_model_dir, fault, monkeypatch
) -> None:
    """Under vLLM the stage hangs with its engine's processes running beside it, which are stopped with it."""
    if kind == "inprocess":
        monkeypatch.setattr(SampleShards, "write", hang_after_first_shard(SampleShards.write))
    else:
        fault("hang-after-shard")
    limit = LIMITS_S["vllm" if backend == "vllm" else kind]
    launcher = StageLauncher(kind=kind, time_limit_base_s=limit, time_limit_per_step_s=0, time_limit_per_sample_s=0)
    config = with_op_config(tiny_config(tiny_model_dir), GENERATIONS_OP, backend=backend)
    with arms_instance() as instance:
        result = materialize(lake_copy(), round_names(1, layout.GENERATIONS), config, ARM, instance, launcher=launcher)
        steps = [
            entry
            for entry in instance.all_logs(result.run_id)
            if entry.step_key == GENERATIONS_OP and entry.dagster_event
        ]

    (retried,) = retries(result, GENERATIONS_OP)
    assert f"stage sample failed: it ran past its time limit of {limit} s" in retried
    assert "Interrupt" not in retried, "a time limit is no interrupt: the step was retried"
    started = next(
        entry.timestamp for entry in steps if entry.dagster_event.event_type == dg.DagsterEventType.STEP_START
    )
    ended = next(
        entry.timestamp for entry in steps if entry.dagster_event.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY
    )
    assert limit <= ended - started < limit + SLACK_S, "the hung attempt ended at its limit"
    assert metadata_of(result, GENERATIONS)["resumed_problems"].value == 2, (
        "the retry resumed after the hung attempt's shard"
    )
    assert leftovers(os.environ["NOISY_STUDENT_TEST_MARKER"]) == [], "the hung worker was stopped with its stage"
