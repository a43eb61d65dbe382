"""The grid stops an arm whose inputs failed in this grid run, in this process: the shared run fails at once (its
problem source and base model do not exist), and no arm's run, nor the verdict's, is launched."""

from __future__ import annotations

from noisy_student_assets.core import layout
from noisy_student_assets.defs import grid as grid_module
from noisy_student_assets.defs.grid import Grid
from resources.data_lake import DataLake
from tests.conftest import TEST_EXPERIMENTS
from tests.lakes import isolated_resources


def test_a_failed_shared_run_stops_the_grid_before_the_arm_runs(tmp_path, monkeypatch, capsys) -> None:
    home, lake = tmp_path / "home", tmp_path / "lake"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("NOISY_STUDENT_DATA_LAKE", str(lake))
    absent_problems = {"kind": "file", "path": str(tmp_path / "absent.jsonl"), "prompt_field": "q", "answer_field": "a"}
    config = {
        "ops": {
            layout.PROBLEM_POOL: {"config": {"source": absent_problems}},
            layout.BASE_MODEL: {"config": {"reference": str(tmp_path / "absent_model")}},
        }
    }
    grid = Grid(TEST_EXPERIMENTS / "grid.yaml", config)
    grid.resources = isolated_resources(DataLake(root=str(lake)))
    launched = []
    materialize_selection = grid_module.materialize_selection

    def recorded(names, *, partition, **settings):
        launched.append(partition or "shared")
        return materialize_selection(names, partition=partition, **settings)

    monkeypatch.setattr(grid_module, "materialize_selection", recorded)

    assert not grid.run()
    output = capsys.readouterr().out
    assert launched == ["shared"], "the shared run, then neither the arm's nor the verdict's"
    stopped = next(line for line in output.splitlines() if line.startswith("[grid] arm g: not run"))
    assert "problem_pool" in stopped and "base_model" in stopped, stopped
    assert "failed in this grid run" in stopped
    assert "[grid] shared: not run" in output, "the verdict reads the shared evaluations"
