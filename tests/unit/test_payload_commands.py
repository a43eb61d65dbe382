"""The launcher's pure parts: the payload's command line, a dead rank told from torchrun's report, the code
location's launcher, the registry of launcher kinds and a stage's time limit."""

from pathlib import Path
from typing import get_args

import polars as pl

from noisy_student_assets.core import environment
from noisy_student_assets.core.settings import (
    ComputeSettings,
    EvalSettings,
    GRPOSettings,
    Launcher,
    LauncherSettings,
    StudentSettings,
    TeacherSamplingSettings,
)
from noisy_student_assets.payloads.specs import EvalSpec, SampleSpec, TrainSpec
from resources import lake_resources
from resources.data_lake import DataLake
from resources.launchers import StageLauncher
from resources.launchers.base import payload_command
from resources.launchers.ray import _shell_returncode
from resources.launchers.registry import LAUNCHERS, launcher_class
from resources.launchers.subprocess import _dead_ranks


def test_one_process_runs_the_payload_module_and_several_run_it_under_torchrun() -> None:
    one = payload_command(Path("/w/spec.json"), 1)
    assert one[1:] == ["-m", "noisy_student_assets.payloads", "/w/spec.json"]
    two = payload_command(Path("/w/spec.json"), 2)
    assert (
        two[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m"]
        and two[-1] == "/w/spec.json"
    )


def test_a_rank_torchrun_reports_dead_is_named_with_its_signal_or_code() -> None:
    tail = [
        "noise\n",
        "E1125 07:00:18.474000 15287 api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 15294) of binary: python\n",
        "E1125 07:00:18.474000 15287 api.py:1002] failed (exitcode: 3) local_rank: 0 (pid: 15293) of binary: python\n",
    ]
    assert _dead_ranks(tail) == ["rank 1 was killed by SIGKILL", "rank 0 exited with code 3"]
    assert _dead_ranks(["all fine\n"]) == []


def test_a_ray_job_s_shell_exit_code_of_128_plus_n_is_signal_n() -> None:
    assert _shell_returncode(137) == -9 and _shell_returncode(143) == -15
    assert _shell_returncode(1) == 1 and _shell_returncode(0) == 0


def test_a_deployment_sets_the_code_location_s_launcher_through_the_environment(monkeypatch) -> None:
    lake = DataLake(root="/tmp/unused")
    monkeypatch.delenv(environment.LAUNCHER, raising=False)
    assert lake_resources(lake)["stage_resources"].launcher.kind == "inprocess"
    monkeypatch.setenv(environment.LAUNCHER, "ray")
    assert lake_resources(lake)["stage_resources"].launcher.kind == "ray"


def test_every_launcher_kind_the_settings_offer_is_a_registered_class_of_that_kind() -> None:
    assert list(LAUNCHERS) == list(get_args(Launcher))
    for kind in LAUNCHERS:
        assert launcher_class(kind).kind == kind
        assert StageLauncher(kind=kind).implementation.settings == LauncherSettings(kind=kind)


def test_a_stage_s_time_limit_grows_with_its_steps_and_its_samples(tmp_path: Path) -> None:
    launcher = LauncherSettings(time_limit_base_s=100, time_limit_per_step_s=10, time_limit_per_sample_s=2)
    problems = tmp_path / "problems.parquet"
    pl.DataFrame({"problem_id": ["a", "b", "c"], "prompt": ["1", "2", "3"]}).write_parquet(problems)
    common = {"compute": ComputeSettings(), "work_dir": str(tmp_path)}
    sample = SampleSpec(
        teacher_dir="t",
        problems=str(problems),
        settings=TeacherSamplingSettings(k=4),
        checkpoint_label="t",
        output="o",
        **common,
    )
    assert sample.time_limit_s(launcher) == 100 + 2 * 3 * 4
    greedy = EvalSpec(
        checkpoint_dir="c", problems=str(problems), settings=EvalSettings(samples=0, ks=[]), output_dir="o", **common
    )
    sampled = EvalSpec(
        checkpoint_dir="c", problems=str(problems), settings=EvalSettings(samples=2, ks=[1]), output_dir="o", **common
    )
    assert greedy.time_limit_s(launcher) == 100 + 2 * 3 and sampled.time_limit_s(launcher) == 100 + 2 * 3 * 3
    train = TrainSpec(
        init_dir="i", dataset="d", settings=StudentSettings(grpo=GRPOSettings(max_steps=5)), output_dir="o", **common
    )
    assert train.time_limit_s(launcher) == 100 + 10 * 5
