"""`compute.device_slots`: how many heavy steps share the device at once, in the grid's `device` pool and in this
machine's device locks, without changing what any stage makes."""

from __future__ import annotations

import threading

import yaml

from noisy_student_assets.core import environment
from noisy_student_assets.core.settings import ComputeSettings
from noisy_student_assets.defs.lineage import made_with
from resources import compute as compute_module
from resources.compute import DEVICE_LOCK_ACQUIRED, DEVICE_LOCK_WAITING, DEVICE_POOL, ComputeResource


def test_a_device_of_two_slots_lets_two_heavy_steps_hold_it_and_a_third_waits_for_one(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(compute_module, "LOCK_POLL_S", 0.05)
    compute = ComputeResource(device="cpu", device_slots=2, lock_dir=str(tmp_path))
    third_log: list[str] = []
    third_holds = threading.Event()

    def third_step() -> None:
        with compute.exclusive(third_log.append):
            third_holds.set()

    first_log, second_log = [], []
    with compute.exclusive(first_log.append):
        with compute.exclusive(second_log.append):
            assert not any(DEVICE_LOCK_WAITING in line for line in first_log + second_log)
            third = threading.Thread(target=third_step)
            third.start()
            assert not third_holds.wait(0.5), "both slots are held"
            assert any(DEVICE_LOCK_WAITING in line for line in third_log)
        assert third_holds.wait(5), "the second slot came free"
        third.join(5)
    held = {line.split()[-1] for line in first_log + second_log if DEVICE_LOCK_ACQUIRED in line}
    assert held == {str(tmp_path / "noisy-student-cpu.lock"), str(tmp_path / "noisy-student-cpu-1.lock")}
    assert str(tmp_path / "noisy-student-cpu-1.lock") in third_log[-1]


def test_device_slots_leave_a_materialization_s_fingerprint_as_it_was() -> None:
    one, four = (ComputeSettings(device_slots=slots).model_dump() for slots in (1, 4))
    assert made_with({"k": 8}, one, "cpu") == made_with({"k": 8}, four, "cpu")
    assert made_with({"k": 8}, one, "cpu") != made_with({"k": 8}, ComputeSettings(dtype="bfloat16").model_dump(), "cpu")


def test_vllm_reserves_a_slot_s_share_of_the_device_memory() -> None:
    options = ComputeSettings(device="cpu", memory_share=0.8, device_slots=4).generation_options()
    assert options["gpu_memory_utilization"] == 0.2


def test_the_grid_holds_the_device_pool_to_the_experiment_s_slots_while_it_runs(tmp_path, monkeypatch) -> None:
    import dagster as dg

    from noisy_student_assets.defs.grid import Grid

    experiments = tmp_path / "experiments"
    experiments.mkdir()
    path = experiments / "slots.yaml"
    path.write_text(yaml.safe_dump({"compute": {"device_slots": 3}, "arms": {"a": {}}}))
    monkeypatch.setenv(environment.EXPERIMENTS, str(experiments))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    grid = Grid(path)
    seen = []

    def materialize_arm(arm, rounds=None, through=None) -> bool:
        seen.append(grid.instance.event_log_storage.get_concurrency_info(DEVICE_POOL).slot_count)
        return True

    monkeypatch.setattr(grid, "materialize_arm", materialize_arm)
    monkeypatch.setattr(grid, "record_hours", lambda arms: None)
    assert grid.run(through=["problem_pool"])
    assert seen == [3]
    assert dg.DagsterInstance.get().event_log_storage.get_concurrency_info(DEVICE_POOL).slot_count == 1
