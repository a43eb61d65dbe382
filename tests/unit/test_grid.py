"""What the grid materializes: an experiment's assets, which of them are stale, and the run configs it refuses."""

from __future__ import annotations

import json
import subprocess
import sys

import dagster as dg
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import ArmSpec, Experiment
from noisy_student_assets.core.experiments.progress import arm_assets
from noisy_student_assets.core.settings import ComputeSettings, LauncherSettings
from noisy_student_assets.defs.current_defaults import CURRENT_DEFAULTS
from noisy_student_assets.defs.grid import (
    checks_not_waiting,
    main,
    unevaluated_checks,
    with_experiment_resources,
)
from tests.cli import REPO_ROOT
from tests.conftest import TEST_EXPERIMENTS


def test_an_experiment_lists_its_rounds_and_controls_in_dependency_order() -> None:
    experiment = Experiment(name="e", controls=("labeled_only",), defaults=ArmSpec(max_rounds=2), arms={"a": ArmSpec()})
    arm = experiment.arm("a")
    names = arm_assets(experiment, arm, rounds=3)
    assert names[:10] == [
        "problem_pool",
        "eval_problems",
        "base_model",
        "base_model_eval",
        "labeled_problems",
        "unlabeled_problems",
        "validation_problems",
        "labeled_rl_checkpoint",
        "labeled_rl_eval",
        "labeled_rl_validation",
    ]
    assert (
        names.index("round_001/student_validation")
        < names.index("round_001/labeled_only_eval")
        < names.index("round_001/eval_report")
        < names.index("round_002/teacher")
        < names.index("round_002/generations")
    ), "round 2's teacher is promoted on the validation accuracy of round 1's student and of labeled RL"
    assert "round_001/gold_label_checkpoint" not in names and names[-1] == "round_002/eval_report"
    assert arm_assets(experiment, arm, rounds=1)[-1] == "round_001/eval_report"
    always = Experiment(name="s", controls=("labeled_only",), arms={"a": ArmSpec(max_rounds=2, promotion="student")})
    names = arm_assets(always, always.arm("a"))
    assert "round_002/teacher" in names, "the student always teaching is a promotion too, drawn the same way"
    assert not [name for name in names if "validation" in name.split("/")[-1] and name != "validation_problems"], (
        "neither a patience nor a promotion reads them"
    )
    one_round = Experiment(name="o", controls=("labeled_only",), arms={"a": ArmSpec(max_rounds=1)})
    assert "round_001/student_validation" not in arm_assets(one_round, one_round.arm("a")), "nothing to promote"
    tuning = Experiment(
        name="t", defaults=ArmSpec(max_rounds=0), validate_labeled_rl=True, held_out_eval=False, arms={"a": ArmSpec()}
    )
    assert arm_assets(tuning, tuning.arm("a"), rounds=3)[-2:] == ["labeled_rl_checkpoint", "labeled_rl_validation"]
    assert "base_model_eval" not in arm_assets(tuning, tuning.arm("a")), "no held-out evaluation at all"


def test_an_arm_with_a_patience_evaluates_labeled_rl_and_every_student_on_its_validation_problems() -> None:
    experiment = Experiment(name="e", controls=("labeled_only",), arms={"a": ArmSpec(patience=2)})
    names = arm_assets(experiment, experiment.arm("a"))
    assert names.index("labeled_rl_validation") < names.index("round_001/generations")
    assert (
        names.index("round_001/student_checkpoint")
        < names.index("round_001/student_validation")
        < names.index("round_002/generations")
    )
    assert names[-1] == "round_002/eval_report", "max_rounds' default: 2"


def test_a_check_is_evaluated_again_only_when_it_did_not_judge_the_latest_materialization() -> None:
    control, student, report = (
        dg.AssetKey(["round_001", "labeled_only_checkpoint"]),
        dg.AssetKey(["round_001", "student_checkpoint"]),
        dg.AssetKey("eval"),
    )
    judged = dg.AssetCheckKey(student, "finite_weights")
    killed_before = dg.AssetCheckKey(
        control, "compute_matched"
    )  # its run was killed between the asset's step and the check's
    stale = dg.AssetCheckKey(control, "finite_weights")  # judged an earlier materialization of the control
    nothing_yet = dg.AssetCheckKey(report, "no_eval_regression")  # its asset was never materialized
    targets = {judged: 7, killed_before: None, stale: 3, nothing_yet: None}
    assert unevaluated_checks(targets, {student: 7, control: 9, report: None}) == [killed_before, stale]
    assert unevaluated_checks({judged: 7}, {student: 7}) == []


def test_a_control_s_compute_match_waits_for_a_student_the_run_redoes() -> None:
    from noisy_student_assets.core import layout
    from noisy_student_assets.defs.code_location import defs

    graph = defs.resolve_asset_graph()
    control = dg.AssetKey(layout.round_asset(1, layout.control_checkpoint(layout.LABELED_ONLY)))
    student = dg.AssetKey(layout.round_asset(1, layout.STUDENT))
    own = [check for check in graph.get(control).check_keys if check.name != CURRENT_DEFAULTS]  # the grid skips it
    checks = sorted(own, key=lambda check: check.name)
    assert [c.name for c in checks] == ["compute_matched", "finite_weights", "smoke_generation"]
    assert [c.name for c in checks_not_waiting(graph, checks, {student})] == ["finite_weights", "smoke_generation"]
    assert checks_not_waiting(graph, checks, {dg.AssetKey(layout.LABELED_RL)}) == checks


def test_an_experiment_names_its_launcher_by_kind_or_by_its_fields_and_the_command_line_replaces_the_kind() -> None:
    from noisy_student_assets.defs.code_location import defs

    by_kind = Experiment(name="e", arms={"a": ArmSpec()}, launcher="subprocess")
    by_fields = Experiment(
        name="e", arms={"a": ArmSpec()}, launcher={"kind": "ray", "gpus_per_process": 1, "sampling_shards": 3}
    )
    assert by_kind.launcher == LauncherSettings(kind="subprocess")
    ray = with_experiment_resources(by_fields)["stage_resources"].launcher
    assert (ray.kind, ray.gpus_per_process, ray.sampling_shards) == ("ray", 1.0, 3)
    inprocess = with_experiment_resources(by_fields, "inprocess")["stage_resources"].launcher
    assert (inprocess.kind, inprocess.sampling_shards) == ("inprocess", 3)
    assert with_experiment_resources(Experiment(name="e", arms={"a": ArmSpec()})) is defs.resources


def test_an_experiment_s_compute_reaches_every_stage_and_the_checks() -> None:
    one_thread = Experiment(name="e", arms={"a": ArmSpec()}, compute={"cpu_threads": 1})
    resources = with_experiment_resources(one_thread)
    assert resources["compute"].cpu_threads == resources["stage_resources"].compute.cpu_threads == 1
    assert resources["compute"].settings == ComputeSettings(cpu_threads=1)
    assert resources["stage_resources"].launcher.kind == "inprocess"


def test_cpu_threads_reach_torch_and_vllm_s_cpu_engine(monkeypatch) -> None:
    import os

    import torch

    for name in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS"):
        monkeypatch.setenv(name, "")  # recorded, so that what apply_threads sets is undone after the test
        monkeypatch.delenv(name)
    threads = torch.get_num_threads()
    try:
        ComputeSettings().apply_threads()
        assert "OMP_NUM_THREADS" not in os.environ, "by default vLLM binds a thread to each core it may use"
        ComputeSettings(cpu_threads=2).apply_threads(processes=2)
        assert torch.get_num_threads() == 1
        assert (os.environ["VLLM_CPU_OMP_THREADS_BIND"], os.environ["OMP_NUM_THREADS"]) == ("nobind", "1")
    finally:
        torch.set_num_threads(threads)


def test_through_keeps_an_asset_and_what_it_reads_in_order() -> None:
    from noisy_student_assets.core import layout
    from noisy_student_assets.defs.code_location import defs
    from noisy_student_assets.defs.grid import assets_through

    experiment = Experiment(
        name="e", controls=("labeled_only", "gold_label"), arms={"v": ArmSpec(max_rounds=2, label_source="verifier")}
    )
    names = arm_assets(experiment, experiment.arm("v"))
    labels = "/".join(layout.round_asset(1, layout.PSEUDO_LABELS))
    graph = defs.resolve_asset_graph()
    kept = assets_through(graph, names, [labels])
    assert kept[-1] == labels and kept == [name for name in names if name in kept], (
        "the arm's own order, ending at the labels"
    )
    assert {"labeled_rl_checkpoint", "round_001/generations", "round_001/verifier", "round_001/verifier_scores"} <= set(
        kept
    )
    assert not [
        name
        for name in kept
        if name.startswith("round_002/") or (name.endswith(("_checkpoint", "_eval")) and name.startswith("round_001/"))
    ]
    assert "labeled_rl_eval" not in kept, "the labels do not read the teacher's held-out eval"
    controls = ["/".join(layout.round_asset(1, layout.eval_of(role))) for role in ("labeled_only", "gold_label")]
    union = assets_through(graph, names, [labels, *controls])
    assert set(union) == set(kept) | set(assets_through(graph, names, controls)), (
        "several assets: the union of what each reads"
    )
    assert "round_001/student_checkpoint" not in union and set(controls) <= set(union)


def test_grid_plan_and_run_refuse_an_unknown_key_in_the_run_config_before_any_run(tmp_path, monkeypatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # a grid that went on would create its instance here
    config = {
        "ops": {
            "problem_pool": {"config": {"bogus": 1}},
            "round_001__generations": {"config": {"k": "eight"}},
            "no_such_op": {"config": {}},
        }
    }
    for command in ("plan", "run"):
        with pytest.raises(SystemExit) as refused:
            main([command, str(TEST_EXPERIMENTS / "grid.yaml"), "--config-json", json.dumps(config)])
        message = str(refused.value)
        assert "refused before any run" in message
        assert "op problem_pool: unknown key bogus (at root:ops:problem_pool:config)" in message
        assert "op round_001__generations: Invalid scalar at path root:ops:round_001__generations:config:k" in message
        assert "op no_such_op: the code location has no such op" in message
    assert not home.exists(), "no instance opened, no run started"


def test_grid_plan_says_what_run_would_do_with_the_same_arms_and_through(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    labels = "/".join(layout.round_asset(1, layout.PSEUDO_LABELS))
    assert main(["plan", str(TEST_EXPERIMENTS / "tests.yaml"), "--arm", "b", "--through", labels]) == 0
    planned = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[grid] arm ")]
    assert planned and all(line.startswith("[grid] arm b: ") for line in planned), planned
    assets = [line.removeprefix("[grid] arm b: ").split(": ")[0] for line in planned]
    assert assets[-1] == labels and not [name for name in assets if name.endswith("_checkpoint") and "/" in name]


def test_the_tests_run_configs_pass_the_grid_s_check() -> None:
    from pathlib import Path

    from noisy_student_assets.defs.code_location import defs
    from noisy_student_assets.defs.grid import run_config_errors
    from tests.tiny_configs import tiny_config

    job = defs.resolve_implicit_global_asset_job_def()
    assert run_config_errors(job, tiny_config(Path("tiny_model"), rounds=2)) == []
    assert run_config_errors(job, {"bogus": 1}) == ["the run config: unknown key bogus (at root)"]


def test_an_interrupted_grid_leaves_when_an_exit_handler_hangs_naming_where() -> None:
    """A library's exit handler that never returns (here: one that sleeps an hour) must not keep a stopped grid
    running: it leaves with the interrupt's status, every thread's stack printed."""
    hanging_exit = (
        "import atexit, time\n"
        "from noisy_student_assets.defs.grid import exit_within\n"
        "def hang_at_exit():\n"
        "    time.sleep(3600)\n"
        "atexit.register(hang_at_exit)\n"
        "exit_within(1.0, 130)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", hanging_exit], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 130, ran.stderr[-2000:]
    assert "[grid] still exiting after 1 s" in ran.stderr and "in hang_at_exit" in ran.stderr, ran.stderr[-2000:]


def test_config_of_an_asset_no_experiment_here_runs_is_ignored_but_a_typo_is_not() -> None:
    """The code location leaves out the controls, verifiers and validation evals no arm of its experiment files runs:
    one run config (tests/tiny_configs.py's, a user's) serves every experiments directory. An op no round defines, or
    of a round past the code location's, is still refused (`run_config_errors`)."""
    from types import SimpleNamespace

    from noisy_student_assets.defs.grid import left_out_ops

    job = SimpleNamespace(graph=SimpleNamespace(node_dict={"round_001__generations": None}))
    left_out = [
        "round_001__gold_label_checkpoint",
        "round_001__gold_label_checkpoint_smoke_generation",
        "round_001__verifier",
        "labeled_rl_validation",
    ]
    configured = [*left_out, "round_001__generations", "round_001__generatoins", "round_002__verifier"]
    assert left_out_ops(job, {"ops": {op: {} for op in configured}}, rounds=1) == left_out


def test_a_grid_takes_a_file_of_the_experiments_directory_or_a_link_to_one_and_refuses_another(
    tmp_path, monkeypatch
) -> None:
    """`make view`'s directory links its experiment's file: the grid registers it by either path."""
    import yaml

    from noisy_student_assets.core import environment
    from noisy_student_assets.defs.grid import Grid

    shipped = tmp_path / "shipped.yaml"
    shipped.write_text(yaml.safe_dump({"arms": {"a": {}}}))
    view = tmp_path / "view"
    view.mkdir()
    (view / "shipped.yaml").symlink_to(shipped)
    monkeypatch.setenv(environment.EXPERIMENTS, str(view))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    assert Grid(shipped).experiment.name == Grid(view / "shipped.yaml").experiment.name == "shipped"
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"arms": {"b": {}}}))
    with pytest.raises(SystemExit, match="experiment files live in"):
        Grid(other)
