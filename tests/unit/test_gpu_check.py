"""`make gpu-check`'s pure parts (tools/gpu_check.py): the SmolLM2 round, which only a CUDA node runs, is a run config
and an experiment the code location accepts; the check table and the `nvidia-smi` samples are read as written. Its
refusal without CUDA: tests/e2e/test_gpu_check_refusal.py; its functional round on the CPU:
tests/e2e/test_offline_install.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from noisy_student_assets.core.experiments.arms import load_experiment
from tools.gpu_check import NVIDIA_SMI_QUERY, GpuSamples, Round, check_outcomes, smollm2_round


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_smollm2_round_is_a_run_config_and_an_experiment_the_code_location_accepts(tmp_path: Path, device) -> None:
    from noisy_student_assets.definitions import defs
    from noisy_student_assets.defs.grid import run_config_errors

    round_ = smollm2_round(tmp_path / "smollm2", device)
    assert run_config_errors(defs.resolve_implicit_global_asset_job_def(), round_.config) == []
    experiment = load_experiment(round_.write_experiment())
    assert list(experiment.arms) == ["smollm2"] and experiment.max_rounds == 1
    ops = round_.config["ops"]
    colocated = ops["round_001__student_checkpoint"]["config"]["grpo"]["use_vllm"]
    assert ops["round_001__generations"]["config"]["backend"] == ("vllm" if colocated else "transformers")
    if device == "cpu":
        assert not colocated, "vLLM only beside CUDA: on the CPU, transformers samples GRPO's groups and the round's"


def test_the_gpu_check_reads_every_row_of_the_grid_s_check_table() -> None:
    table = (
        "| arm | asset | check | outcome |\n|---|---|---|---|\n| v | base_model | finite_weights | passed |\n"
        "| v | round_001/verifier | verifier_informative | failed |\n\n| check | outcome | checks |\n|---|---|---|\n"
        "| finite_weights | passed | 1 |\n"
    )
    assert check_outcomes(table) == [
        {"arm": "v", "asset": "base_model", "check": "finite_weights", "outcome": "passed"},
        {"arm": "v", "asset": "round_001/verifier", "check": "verifier_informative", "outcome": "failed"},
    ]


def test_a_round_s_gpu_figures_are_read_from_its_own_nvidia_smi_samples(tmp_path: Path) -> None:
    assert NVIDIA_SMI_QUERY.split(",")[2:4] == ["utilization.gpu", "memory.used"]
    lines = [
        "2026/11/28 03:00:00.000, NVIDIA H100 80GB HBM3, 90, 70000, 81559, 300.1",
        "2026/11/28 03:00:01.000, NVIDIA H100 80GB HBM3, 10, 2000, 81559, 80.2",
        "2026/11/28 03:00:02.000, NVIDIA H100 80GB HBM3, 30, 5000, 81559, 120.0",
        "2026/11/28 03:00:03.000, NVIDIA H100 80GB HBM3, [N/A], 5000, 81559, [N/A]",
    ]
    (tmp_path / "smi.csv").write_text("\n".join(lines) + "\n")
    samples = GpuSamples(tmp_path / "smi.csv")
    assert samples.summary(1, samples.count()) == {
        "samples": 2,
        "card": "NVIDIA H100 80GB HBM3",
        "peak_memory_mib": 5000.0,
        "memory_total_mib": 81559.0,
        "mean_utilization_percent": 20.0,
        "peak_utilization_percent": 30.0,
    }, "the first sample is an earlier round's; a sample without a reading is left out"
    assert GpuSamples(tmp_path / "none.csv").summary(0, 0) == {"samples": 0}


def test_a_round_passes_only_when_every_payload_ran_on_its_experiment_s_device(tmp_path: Path) -> None:
    checks = [{"arm": "v", "asset": "base_model", "check": "finite_weights", "outcome": "passed"}]
    on = {"payload/host": "node1", "payload/cuda_visible_devices": "0"}
    outcome = {"grid_exit": 0, "summary_exit": 0, "checks": checks}

    def passed(*devices: str) -> bool:
        assets = {f"asset{i}": on | {"payload/device": device} for i, device in enumerate(devices)} | {"verdict": {}}
        round_ = Round("r", tmp_path, {"compute": {"device": "cuda"}}, {}, outcome | {"assets": assets})
        return round_.passed

    assert passed("cuda (NVIDIA H100 80GB HBM3)", "cuda (NVIDIA H100 80GB HBM3)")
    assert not passed("cuda (NVIDIA H100 80GB HBM3)", "cpu"), "a stage that fell back to the CPU fails the round"
    assert not passed(), "a round without payloads proves nothing about them"
