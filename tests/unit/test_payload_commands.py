"""The launcher's pure parts: the payload's command line, a dead rank told from torchrun's report, and the code
location's launcher."""

from pathlib import Path

from resources import lake_resources
from resources.data_lake import DataLake
from resources.launchers import LAUNCHER_ENV_VAR, _dead_ranks, _shell_returncode, payload_command


def test_one_process_runs_the_payload_module_and_several_run_it_under_torchrun() -> None:
    one = payload_command(Path("/w/spec.json"), 1)
    assert one[1:] == ["-m", "noisy_student_assets.payloads", "/w/spec.json"]
    two = payload_command(Path("/w/spec.json"), 2)
    assert two[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m"] and two[-1] == "/w/spec.json"


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
    monkeypatch.delenv(LAUNCHER_ENV_VAR, raising=False)
    assert lake_resources(lake)["stage_resources"].launcher.kind == "inprocess"
    monkeypatch.setenv(LAUNCHER_ENV_VAR, "ray")
    assert lake_resources(lake)["stage_resources"].launcher.kind == "ray"
