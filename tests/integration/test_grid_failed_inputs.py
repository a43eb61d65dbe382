"""The grid stops an arm at its failed inputs, in this process: the arm's task (its problem source) and base model
do not exist, so its one run fails at once; nothing that reads them is materialized, and the verdict still runs."""

from __future__ import annotations

from noisy_student_assets.core import layout
from noisy_student_assets.defs import grid as grid_module
from noisy_student_assets.defs.grid import Grid
from noisy_student_assets.defs.records import latest_materialization
from resources.data_lake import DataLake
from tests.conftest import TEST_EXPERIMENTS
from tests.lakes import isolated_resources


def test_an_arm_whose_inputs_fail_stops_at_them(tmp_path, monkeypatch, capsys) -> None:
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
        launched.append((partition or "verdict", names[0]))
        return materialize_selection(names, partition=partition, **settings)

    monkeypatch.setattr(grid_module, "materialize_selection", recorded)

    assert not grid.run()
    output = capsys.readouterr().out
    assert launched == [("g", layout.PROBLEM_POOL), ("verdict", layout.VERDICT)], "one run of the arm, its inputs first"
    assert "[grid] arm g: run" in output and "failed" in output, output
    for name in (layout.PROBLEM_POOL, layout.BASE_MODEL, layout.LABELED_PROBLEMS, layout.LABELED_RL):
        assert latest_materialization(grid.instance, grid_module.asset_key(name), "g") is None, name
