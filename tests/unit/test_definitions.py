"""The code location's wiring: arms as partitions, rounds as key prefixes with every input drawn as an edge,
the device pool, blocking checks, and the experiment files the repository ships."""

import importlib.util
import json
import re
import shutil
from pathlib import Path

import dagster as dg
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import ROUNDS as ROUNDS_STAGE
from noisy_student_assets.core.experiments.arms import STAGES, load_experiments
from noisy_student_assets.core.settings import RUN_TIME_LIMIT_S, resolved
from noisy_student_assets.core.staleness import digest
from noisy_student_assets.definitions import defs
from noisy_student_assets.defs.grid import named_job
from noisy_student_assets.defs.jobs import ARM_JOB, MAX_RUNTIME_TAG, STEP_EXECUTOR, STEP_PRELOAD
from noisy_student_assets.defs.partitions import ARMS, ROUNDS
from resources.compute import DEVICE_POOL

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED = {layout.VERDICT}


def _round(number: int, name: str) -> str:
    return "/".join(layout.round_asset(number, name))


def _parents(name: str) -> set[str]:
    graph = defs.resolve_asset_graph()
    return {key.to_user_string() for key in graph.get(dg.AssetKey(name.split("/"))).parent_keys}


def test_the_code_location_keeps_the_names_of_the_snapshot() -> None:
    """Asset keys, groups, arm partitions, pools, check names, op names (run config keys), jobs and sensors are those
    tests/snapshots/code_location.json recorded before the core/defs split, so lakes and instances made earlier still
    match."""
    snapshot = json.loads((REPO_ROOT / "tests" / "snapshots" / "code_location.json").read_text())
    graph = defs.resolve_asset_graph()
    assets = {
        key.to_user_string(): {
            "group": graph.get(key).group_name,
            "partitioned_by": graph.get(key).partitions_def.name if graph.get(key).partitions_def is not None else None,
            "pools": sorted(graph.get(key).pools or []),
        }
        for key in graph.get_all_asset_keys()
    }
    assert assets == snapshot["assets"]
    checks = {key.to_user_string(): {"blocking": graph.get_check_spec(key).blocking} for key in graph.asset_check_keys}
    assert checks == snapshot["checks"]
    assert sorted(defs.resolve_implicit_global_asset_job_def().graph.node_dict) == snapshot["ops"]
    assert sorted(job.name for job in defs.resolve_all_job_defs() if not job.name.startswith("__")) == snapshot["jobs"]
    assert sorted(sensor.name for sensor in defs.sensors) == snapshot["sensors"]


def test_every_shipped_arm_keeps_its_settings() -> None:
    """The grid redoes a stage whose effective settings changed (`staleness.fingerprint`): every shipped arm's are
    those of its snapshot, so no lake made earlier is redone for a refactor, or for a new default that an experiment
    pins its old value against. The default arm's labeled RL, labeled-only control and student moved with the
    default teacher and round steps (issue 72); its entry is theirs since."""
    snapshot = json.loads((REPO_ROOT / "tests" / "snapshots" / "code_location.json").read_text())["arm_settings_sha"]
    fingerprints = {
        f"{experiment.name}/{arm.name}": {
            stage: digest(resolved(arm.spec.settings(stage)), 16) for stage in STAGES if stage != ROUNDS_STAGE
        }
        for experiment in load_experiments(REPO_ROOT / "experiments").values()
        for arm in experiment.all_arms()
    }
    assert {name: fingerprints.get(name) for name in snapshot} == snapshot


def test_dagster_yaml_limits_the_device_pool_to_one_op(tmp_path: Path, monkeypatch) -> None:
    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.chdir(tmp_path)
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        pools = instance.get_concurrency_config().pool_config
        assert pools.default_pool_limit == 1 and pools.pool_granularity.value == "op"


def test_run_monitoring_stops_every_daemon_launched_run_past_the_run_time_limit_and_frees_its_slots(
    tmp_path: Path, monkeypatch
) -> None:
    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.chdir(tmp_path)
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_max_runtime_seconds == RUN_TIME_LIMIT_S, "dagster.yaml mirrors the setting"
        assert instance.run_monitoring_settings["free_slots_after_run_end_seconds"] > 0
    jobs = [job for job in defs.resolve_all_job_defs() if not job.name.startswith("__")]
    assert jobs and all(
        job.tags[MAX_RUNTIME_TAG] == job.run_tags[MAX_RUNTIME_TAG] == str(RUN_TIME_LIMIT_S) for job in jobs
    )


def _execution(config: dict) -> dict:
    """What a run's `execution: {config: ...}` comes to under the code location's executor."""
    return STEP_EXECUTOR.apply_config_mapping({"config": config}).value["config"]


def test_every_job_forks_its_steps_from_a_preloaded_server_unless_its_run_says_otherwise() -> None:
    jobs = [defs.resolve_implicit_global_asset_job_def(), *(defs.resolve_job_def(job.name) for job in defs.jobs)]
    assert {job.executor_def for job in jobs} == {STEP_EXECUTOR}
    default = STEP_EXECUTOR.config_schema.as_field().default_value
    assert _execution(default)["multiprocess"]["start_method"] == {"forkserver": {"preload_modules": STEP_PRELOAD}}
    assert _execution({"multiprocess": {"max_concurrent": 1}})["multiprocess"]["start_method"]["forkserver"]
    spawned = _execution({"multiprocess": {"start_method": {"spawn": {}}}})
    assert spawned["multiprocess"]["start_method"] == {"spawn": {}}
    assert "in_process" in _execution({"in_process": {}})
    # a module the server cannot import fails every multiprocess run at its first step
    assert all(importlib.util.find_spec(module) for module in STEP_PRELOAD)


def test_a_grid_run_is_named_after_the_smallest_job_that_holds_its_assets() -> None:
    def named(*names: str, partition: str | None = "a") -> str:
        return named_job({dg.AssetKey(name.split("/")) for name in names}, partition).name

    assert named(_round(2, layout.STUDENT), _round(2, layout.EVAL_REPORT)) == "round_002_job"
    assert named(_round(1, layout.VERIFIER)) == "round_001_verifier_job"
    assert named(layout.PROBLEM_POOL, layout.LABELED_RL) == ARM_JOB
    assert named(_round(1, layout.STUDENT), _round(2, layout.STUDENT)) == ARM_JOB
    assert named(layout.VERDICT, partition=None) == "verdict_job"


def test_every_heavy_asset_runs_in_the_device_pool() -> None:
    graph = defs.resolve_asset_graph()
    pools = {key.to_user_string(): graph.get(key).pools for key in graph.get_all_asset_keys()}
    heavy = {name for name, asset_pools in pools.items() if asset_pools and DEVICE_POOL in asset_pools}
    expected = {layout.BASE_MODEL_EVAL, layout.LABELED_RL, layout.LABELED_RL_EVAL, layout.LABELED_RL_VALIDATION}
    for number in range(1, ROUNDS + 1):
        expected |= {
            _round(number, name)
            for name in (
                layout.GENERATIONS,
                layout.VERIFIER,
                layout.VERIFIER_SCORES,
                layout.STUDENT,
                layout.STUDENT_VALIDATION,
                layout.EVAL_REPORT,
            )
        }
        expected |= {
            _round(number, name)
            for c in layout.CONTROLS
            for name in (layout.control_checkpoint(c), layout.control_eval(c))
        }
    assert heavy == expected


def test_arms_partition_every_asset_but_the_shared_ones() -> None:
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        expected = None if key.to_user_string() in SHARED else ARMS
        assert graph.get(key).partitions_def == expected, key.to_user_string()


def test_every_real_input_is_a_drawn_edge() -> None:
    assert ROUNDS == 3  # tests/experiments/automation.yaml
    assert _parents(_round(1, layout.GENERATIONS)) == {layout.LABELED_RL, layout.UNLABELED_PROBLEMS}
    assert _parents(_round(2, layout.GENERATIONS)) == {_round(2, layout.TEACHER), layout.UNLABELED_PROBLEMS}
    assert _parents(_round(2, layout.TEACHER)) == {
        _round(1, layout.STUDENT),
        layout.LABELED_RL,
        _round(1, layout.STUDENT_VALIDATION),
        layout.LABELED_RL_VALIDATION,
    }, "round 2's teacher: round 1's student or its teacher, by their validation accuracy"
    assert _parents(_round(3, layout.TEACHER)) == {
        _round(2, layout.STUDENT),
        _round(2, layout.TEACHER),
        _round(2, layout.STUDENT_VALIDATION),
    }, "a promoted teacher carries its own validation accuracy"
    assert _parents(_round(2, layout.PSEUDO_LABELS)) == {
        _round(2, layout.GENERATIONS),
        _round(2, layout.VERIFIER_SCORES),
        layout.UNLABELED_PROBLEMS,
    }
    assert _parents(_round(2, layout.VERIFIER)) == {
        _round(2, layout.TEACHER),
        layout.LABELED_PROBLEMS,
        layout.VALIDATION_PROBLEMS,
    }
    assert _parents(_round(2, layout.VERIFIER_SCORES)) == {
        _round(2, layout.VERIFIER),
        _round(2, layout.GENERATIONS),
        layout.UNLABELED_PROBLEMS,
    }
    assert {_round(2, layout.PSEUDO_LABELS), _round(2, layout.TEACHER), layout.LABELED_PROBLEMS} <= _parents(
        _round(2, layout.STUDENT)
    )
    assert _parents(_round(2, layout.EVAL_REPORT)) >= {
        _round(2, layout.STUDENT),
        _round(2, layout.PSEUDO_LABELS),
        _round(2, "labeled_only_eval"),
        _round(1, layout.EVAL_REPORT),
        layout.LABELED_RL_EVAL,
        layout.BASE_MODEL_EVAL,
        layout.EVAL_PROBLEMS,
    }
    # a control's completion cap comes from the round's teacher samples, as the student's does
    assert _parents(_round(1, "labeled_only_checkpoint")) == {
        layout.LABELED_RL,
        layout.LABELED_PROBLEMS,
        _round(1, layout.GENERATIONS),
    }
    assert _parents(_round(2, "labeled_only_checkpoint")) == {
        _round(1, "labeled_only_checkpoint"),
        layout.LABELED_PROBLEMS,
        _round(2, layout.GENERATIONS),
    }
    for control in (layout.GOLD_LABEL, layout.RANDOM_LABEL):
        assert _round(2, layout.GENERATIONS) in _parents(_round(2, layout.control_checkpoint(control)))
    assert _round(2, layout.PSEUDO_LABELS) in _parents(_round(2, "random_label_checkpoint"))
    assert _round(2, "random_label_eval") in _parents(layout.VERDICT)


def test_every_checkpoint_and_eval_has_blocking_checks() -> None:
    graph = defs.resolve_asset_graph()
    blocking = {key.to_user_string() for key in graph.asset_check_keys if graph.get_check_spec(key).blocking}
    checkpoints = [
        layout.BASE_MODEL,
        layout.LABELED_RL,
        _round(1, layout.STUDENT),
        *(_round(2, f"{c}_checkpoint") for c in layout.CONTROLS),
    ]
    evals = [
        layout.BASE_MODEL_EVAL,
        layout.LABELED_RL_EVAL,
        _round(1, layout.EVAL_REPORT),
        _round(2, "gold_label_eval"),
    ]
    expected = {f"{c}:{name}" for c in checkpoints for name in ("finite_weights", "smoke_generation")}
    expected |= {f"{e}:eval_not_degenerate" for e in evals} | {
        f"{_round(2, layout.PSEUDO_LABELS)}:pseudo_label_quality"
    }
    assert expected <= blocking
    compute_matched = dg.AssetCheckKey(dg.AssetKey(layout.round_asset(2, "labeled_only_checkpoint")), "compute_matched")
    assert compute_matched in graph.asset_check_keys and graph.get_check_spec(compute_matched).partitions_def == ARMS
    assert graph.get_check_spec(compute_matched).blocking
    for key in graph.asset_check_keys:  # what stops work says so where the UI shows it
        spec = graph.get_check_spec(key)
        assert spec.blocking == spec.description.startswith("Blocking:"), key.to_user_string()


def test_round_keys_come_from_one_place() -> None:
    assert layout.round_prefix(7) == "round_007" and layout.round_number("round_012") == 12
    with pytest.raises(ValueError, match="not a round prefix"):
        layout.round_number("round-012")
    sources = [p for p in (REPO_ROOT / "noisy_student_assets").rglob("*.py") if p.name != "layout.py"]
    round_key = re.compile(r'f?"round[_-](\d|\{)')  # a round prefix spelled out, not the arm field "round_steps"
    assert not [p for p in sources if round_key.search(p.read_text())]


def test_the_shipped_experiment_files_are_valid() -> None:
    experiments = load_experiments(REPO_ROOT / "experiments")
    assert experiments["default"].arms.keys() == {layout.DEFAULT_ARM} and experiments["default"].max_rounds == 2
    for experiment in experiments.values():
        assert layout.LABELED_ONLY in experiment.controls


def test_the_gpu_profile_stabilises_bf16_training() -> None:
    """The profile is read when the settings module loads, so it is checked in a fresh interpreter, through the
    Dagster config the launchpad shows."""
    import os
    import subprocess
    import sys

    code = (
        "import json; from noisy_student_assets.defs.config import LabeledRLConfig, EvalConfig, SamplingConfig;"
        "from resources.compute import ComputeResource;"
        "print(json.dumps([LabeledRLConfig().grpo.model_dump(), SamplingConfig().batch_size,"
        " EvalConfig().batch_size, ComputeResource().dtype]))"
    )
    env = os.environ | {"NOISY_STUDENT_PROFILE": "gpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    grpo, sampling_batch, eval_batch, dtype = json.loads(out.stdout.strip().splitlines()[-1])
    assert dtype == "bfloat16" and grpo["cast_lm_head_to_fp32"] and grpo["max_consecutive_skipped_steps"] == 3
    assert grpo["max_steps"] == 200 and sampling_batch == eval_batch == 128


def test_a_code_location_defines_only_what_its_experiments_run(tmp_path) -> None:
    """An experiments directory whose one experiment runs the labeled-only control alone, reads no verifier, has no
    patience and lets the student always teach: no other control, no verifier, no validation eval and no job for
    them, so that its lineage and its launches hold only what its arm runs (the UI's side:
    tests/ui/test_adding_a_round.py)."""
    import os
    import subprocess
    import sys

    import yaml

    from noisy_student_assets.core.experiments.arms import load_experiment
    from noisy_student_assets.core.experiments.progress import arm_assets

    lean = {
        "controls": [layout.LABELED_ONLY],
        "defaults": {"max_rounds": 2, "promotion": "student"},
        "arms": {"lean": {}},
    }
    (tmp_path / "lean.yaml").write_text(yaml.safe_dump(lean))
    code = (
        "import json; from noisy_student_assets.definitions import defs; graph = defs.resolve_asset_graph();"
        "print(json.dumps([sorted(key.to_user_string() for key in graph.get_all_asset_keys()),"
        " sorted(job.name for job in defs.resolve_all_job_defs() if not job.name.startswith('__'))]))"
    )
    env = os.environ | {"NOISY_STUDENT_EXPERIMENTS": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assets, jobs = json.loads(out.stdout.strip().splitlines()[-1])
    experiment = load_experiment(tmp_path / "lean.yaml")
    assert set(assets) == {*arm_assets(experiment, experiment.arm("lean")), *SHARED}
    assert jobs == ["arm_job", "round_001_job", "round_002_job", "verdict_job"]


def test_an_experiment_s_own_view_and_the_union_view_agree_on_every_code_version(tmp_path) -> None:
    """`make view` of one experiment (one round, one control, no verifier, no validation) over the lake the union
    view materialized: every asset the view has carries the union's code version, and so none made in the union
    reads as made with other code in the view (the current-defaults check's judgement)."""
    import os
    import subprocess
    import sys

    import yaml

    view = tmp_path / "view"
    view.mkdir()
    lean = {"controls": [layout.LABELED_ONLY], "defaults": {"max_rounds": 1}, "arms": {"lean": {}}}
    (view / "lean.yaml").write_text(yaml.safe_dump(lean))
    (tmp_path / "home").mkdir()
    load = (
        "import json, dagster as dg; from noisy_student_assets.definitions import defs;"
        "from noisy_student_assets.defs.current_defaults import judge;"
        "from noisy_student_assets.defs.lineage import CODE_VERSION_TAG;"
        "graph = defs.resolve_asset_graph(); instance = dg.DagsterInstance.get();"
        "versions = {key.to_user_string(): graph.get(key).code_version for key in graph.get_all_asset_keys()};"
    )
    materialize_all = (
        "instance.add_dynamic_partitions('arm', ['default']);"
        "[instance.report_runless_asset_event(dg.AssetMaterialization(key, partition='default'"
        " if graph.get(key).is_partitioned else None, tags={CODE_VERSION_TAG: graph.get(key).code_version}))"
        " for key in graph.get_all_asset_keys()];"
        "print(json.dumps(versions))"
    )
    stale = (
        "print(json.dumps([versions, [k.to_user_string() for k, v in judge(instance, graph).items() if not v.passed]]))"
    )

    def run(experiments: Path, code: str):
        env = os.environ | {"NOISY_STUDENT_EXPERIMENTS": str(experiments), "DAGSTER_HOME": str(tmp_path / "home")}
        out = subprocess.run(
            [sys.executable, "-c", load + code], env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    union = run(REPO_ROOT / "tests" / "experiments", materialize_all)
    in_view, stale_in_view = run(view, stale)
    assert set(in_view) < set(union)  # the view defines fewer assets: the case this test is for
    assert {key: union[key] for key in in_view} == in_view
    assert stale_in_view == []
