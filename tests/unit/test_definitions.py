"""The code location's wiring: the gpu pool, round partitions, and which assets are heavy."""

import shutil
from pathlib import Path

import dagster as dg
import pytest

from noisy_student_assets.definitions import defs
from noisy_student_assets.partitions import ROUNDS, previous_round_key, round_key, round_number
from resources.compute import GPU_POOL

REPO_ROOT = Path(__file__).resolve().parents[2]
HEAVY_ASSETS = {
    "labeled_rl_checkpoint", "base_model_eval", "labeled_rl_eval",
    "generations", "pseudo_labels", "student_checkpoint", "eval_report",
    "gold_label_rl_checkpoint", "gold_label_rl_eval",
}


def test_dagster_yaml_limits_the_gpu_pool_to_one_op(tmp_path: Path, monkeypatch) -> None:
    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.chdir(tmp_path)
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        pools = instance.get_concurrency_config().pool_config
        assert pools.default_pool_limit == 1 and pools.pool_granularity.value == "op"


def test_every_heavy_asset_runs_in_the_gpu_pool() -> None:
    graph = defs.resolve_asset_graph()
    pools = {key.to_user_string(): graph.get(key).pools for key in graph.get_all_asset_keys()}
    assert {name for name, asset_pools in pools.items() if asset_pools and GPU_POOL in asset_pools} == HEAVY_ASSETS


def test_round_assets_are_partitioned_by_round_and_self_dependent() -> None:
    graph = defs.resolve_asset_graph()
    for name in ("generations", "pseudo_labels", "student_checkpoint", "eval_report"):
        assert graph.get(dg.AssetKey(name)).partitions_def == ROUNDS
    student = graph.get(dg.AssetKey("student_checkpoint"))
    assert dg.AssetKey("student_checkpoint") in student.parent_keys


def test_round_keys() -> None:
    assert ROUNDS.get_partition_keys()[:2] == ["round-001", "round-002"]
    assert round_number("round-012") == 12 and round_key(12) == "round-012"
    assert previous_round_key("round-001") is None and previous_round_key("round-010") == "round-009"
    with pytest.raises(ValueError, match="not a round partition key"):
        round_number("2024-01-01")


CHECKPOINTS = ("base_model", "labeled_rl_checkpoint", "student_checkpoint", "gold_label_rl_checkpoint")
EVALS = ("base_model_eval", "labeled_rl_eval", "gold_label_rl_eval", "eval_report")


def test_every_checkpoint_and_eval_has_blocking_checks() -> None:
    graph = defs.resolve_asset_graph()
    blocking = {
        key.to_user_string() for key in graph.asset_check_keys if graph.get_check_spec(key).blocking
    }
    expected = {f"{c}:{name}" for c in CHECKPOINTS for name in ("finite_weights", "smoke_generation")}
    expected |= {f"{e}:eval_not_degenerate" for e in EVALS} | {"pseudo_labels:pseudo_label_quality"}
    assert expected <= blocking
    assert graph.get_check_spec(dg.AssetCheckKey(dg.AssetKey("student_checkpoint"), "finite_weights")).partitions_def == ROUNDS


def test_the_gpu_profile_stabilises_bf16_training() -> None:
    """The profile is read when the config module loads, so it is checked in a fresh interpreter."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json; from noisy_student_assets.config import RoundConfig, LabeledRLConfig, EvalConfig;"
        "print(json.dumps([LabeledRLConfig().grpo.model_dump(), RoundConfig().sampling.batch_size, EvalConfig().batch_size]))"
    )
    env = os.environ | {"NOISY_STUDENT_PROFILE": "gpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    grpo, sampling_batch, eval_batch = json.loads(out.stdout.strip().splitlines()[-1])
    assert grpo["bf16"] and grpo["cast_lm_head_to_fp32"] and grpo["max_consecutive_skipped_steps"] == 3
    assert sampling_batch == eval_batch == 128
