"""Arms of two tasks in one lake and one instance, as `experiments/headroom.yaml`'s are: the grid runs them like any
arms, each draws from its own task's pool and held-out set, they share the converted base model, and the headroom
table reads them from that lake, a line per task."""

from __future__ import annotations

import dagster as dg

from noisy_student_assets import headroom
from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import load_experiment
from noisy_student_assets.core.experiments.tasks import load_tasks
from noisy_student_assets.core.reporting.headroom import headroom_table
from noisy_student_assets.defs.grid import Grid
from resources.data_lake import DataLake
from tests.conftest import TEST_EXPERIMENTS
from tests.lakes import isolated_resources
from tests.tiny_configs import tiny_config

EXPERIMENT = TEST_EXPERIMENTS / "two_tasks.yaml"


def test_arms_of_two_tasks_run_in_one_lake_and_the_table_reads_them(tmp_path, monkeypatch, tiny_model_dir, capsys):
    home, root = tmp_path / "home", tmp_path / "lake"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("NOISY_STUDENT_DATA_LAKE", str(root))
    grid = Grid(EXPERIMENT, tiny_config(tiny_model_dir, rounds=1))
    lake = DataLake(root=str(root))
    grid.resources = isolated_resources(lake)
    assert grid.run()

    tasks = load_tasks()
    for arm, task in (("sums-s0", "two-digit-sums"), ("chains-s0", "chain-sums")):
        pool = lake.read_table(dg.AssetKey(layout.PROBLEM_POOL), arm)
        held_out = lake.read_table(dg.AssetKey(layout.EVAL_PROBLEMS), arm)
        assert pool.height == tasks[task].training_source.size, "the task's pool, not the run config's 40 problems"
        assert 0 < held_out.height <= tasks[task].eval_source.size
        assert set(pool["prompt"]).isdisjoint(held_out["prompt"])
    sums, chains = (lake.read_table(dg.AssetKey(layout.EVAL_PROBLEMS), arm) for arm in ("sums-s0", "chains-s0"))
    assert set(sums["prompt"]).isdisjoint(chains["prompt"]), "two tasks, two held-out sets"
    weights = [root / layout.BASE_MODEL / arm / "model.safetensors" for arm in ("sums-s0", "chains-s0")]
    assert weights[0].stat().st_ino == weights[1].stat().st_ino, "one model, converted once"

    table = headroom_table(root, load_experiment(EXPERIMENT).all_arms())
    assert table["task"].to_list() == ["two-digit-sums", "chain-sums"]
    assert table["seeds"].to_list() == [1, 1], "each task's seed"
    assert table["labeled_only"].null_count() == 0 and table["gold_label"].null_count() == 0
    capsys.readouterr()
    assert headroom.main(["--experiment", str(EXPERIMENT), "--lake", str(root)]) == 0
    printed = capsys.readouterr().out
    assert "| two-digit-sums | defaults | 1 |" in printed and "| chain-sums | defaults | 1 |" in printed
