"""The headroom table (no model: each task's lake is written by hand in the layout the assets publish)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import load_experiment
from noisy_student_assets.core.problems import load_problems
from noisy_student_assets.core.reporting.headroom import grid_task, load_tasks, task_row
from noisy_student_assets.core.settings import DEFAULT_EVAL_SOURCE, EvalProblemsSettings, ProblemPoolSettings
from noisy_student_assets.headroom import EXPERIMENT, TASKS
from tests.unit.test_summary import write_audit

PROBLEMS = 60
ARMS = load_experiment(EXPERIMENT).all_arms()


def _eval(lake: Path, key_path, arm: str, correct: np.ndarray) -> None:
    directory = layout.artifact_dir(lake, key_path, arm)
    directory.mkdir(parents=True)
    metrics = {"greedy_accuracy": float(correct.mean()), "problems": float(correct.size)}
    (directory / layout.METRICS_FILE).write_text(json.dumps({"metrics": metrics}))
    ids = [f"p{i:02d}" for i in range(correct.size)]
    pl.DataFrame({"problem_id": ids, "greedy_correct": correct.astype(bool)}).write_parquet(
        directory / layout.SCORES_FILE
    )


def _task_lake(lake: Path, gold_gain: float, seeds: int = 3) -> Path:
    """Per seed: labeled RL right on 0.4 of validation, its votes right on 0.5 of the unlabeled problems and one
    sample on 0.7; gold labels right on `gold_gain` more held-out problems than labeled-only (give or take a seed)."""
    rng = np.random.default_rng(0)
    for arm in ARMS[:seeds]:
        _eval(lake, layout.LABELED_RL_VALIDATION, arm.name, np.arange(100) < 40)
        write_audit(lake, arm.name, teacher_maj_at_k=0.5, teacher_pass_at_k=0.7)
        labeled_only = rng.random(PROBLEMS) < 0.4
        gained = labeled_only | (rng.random(PROBLEMS) < gold_gain)
        _eval(lake, layout.round_asset(1, layout.control_eval(layout.LABELED_ONLY)), arm.name, labeled_only)
        _eval(lake, layout.round_asset(1, layout.control_eval(layout.GOLD_LABEL)), arm.name, gained)
    return lake


def test_the_tasks_are_the_profile_s_sources_with_their_own_generator() -> None:
    tasks = load_tasks(TASKS)
    assert list(tasks) == ["two-digit-sums", "chain-sums", "products"]
    sums = tasks["two-digit-sums"].run_config()["ops"]
    assert (
        ProblemPoolSettings(**sums[layout.PROBLEM_POOL]["config"]).resolved_source
        == ProblemPoolSettings().resolved_source
    )
    held_out = EvalProblemsSettings(
        **tasks["chain-sums"].run_config()["ops"][layout.EVAL_PROBLEMS]["config"]
    ).resolved_source
    assert (held_out.name, held_out.size, held_out.seed) == (
        "chain_sum",
        tasks["chain-sums"].eval_candidates,
        DEFAULT_EVAL_SOURCE.seed,
    )
    assert tasks["chain-sums"].eval_candidates > DEFAULT_EVAL_SOURCE.size == tasks["products"].eval_candidates
    problems = load_problems(**held_out.load_kwargs())
    assert problems.height == tasks["chain-sums"].eval_candidates and "-" in " ".join(problems["prompt"])


def test_a_task_row_has_both_headrooms_over_its_seeds(tmp_path: Path) -> None:
    task = load_tasks(TASKS)["products"]
    row = task_row(task, _task_lake(tmp_path, gold_gain=0.5), ARMS)
    assert row["seeds"] == 3 and row["teacher_validation_greedy"] == pytest.approx(0.4)
    assert row["label_headroom"] == pytest.approx(0.2) and row["maj_at_k"] == pytest.approx(0.5)
    assert row["gold_label"] - row["labeled_only"] == pytest.approx(row["data_headroom"])
    assert row["data_headroom_low"] > 0 and row["outcome"] == "better" and row["data_headroom_seeds"] == 3
    empty = task_row(task, tmp_path / "not-run", ARMS)
    assert empty["seeds"] == 0 and empty["outcome"] == "not run" and empty["label_headroom"] is None


def test_the_grid_takes_the_task_with_data_headroom_and_the_most_label_headroom(tmp_path: Path) -> None:
    tasks = load_tasks(TASKS)
    rows = [
        task_row(tasks["two-digit-sums"], _task_lake(tmp_path / "a", gold_gain=0.0), ARMS),
        task_row(tasks["chain-sums"], _task_lake(tmp_path / "b", gold_gain=0.5), ARMS),
        task_row(tasks["products"], _task_lake(tmp_path / "c", gold_gain=0.5, seeds=2), ARMS),  # 2 seeds: not enough
    ]
    table = pl.DataFrame(rows)
    assert table["outcome"][0] == "no difference"
    assert grid_task(table) == "chain-sums"
    assert grid_task(table.filter(pl.col("task") != "chain-sums")) is None


def test_seeds_exported_in_turns_give_the_table_of_the_lake_that_made_them(tmp_path: Path, monkeypatch) -> None:
    """Seeds run in different sessions pool in one results directory (`headroom export`, then `table --lake`)."""
    from noisy_student_assets import headroom
    from noisy_student_assets.core.reporting.headroom import task_lake

    lake = tmp_path / "data_lake"
    _task_lake(task_lake(lake, "chain-sums"), gold_gain=0.5)
    monkeypatch.setenv("NOISY_STUDENT_DATA_LAKE", str(lake))
    results = tmp_path / "results"
    for arm in ARMS:  # one session a seed
        one_seed = tmp_path / "one_seed.yaml"
        one_seed.write_text(f"arms:\n  {arm.name}: {{seed: {arm.spec.seed}}}\n")
        assert (
            headroom.main(["export", "--task", "chain-sums", "--experiment", str(one_seed), "--to", str(results)]) == 0
        )
    assert headroom.table(results).equals(headroom.table(lake))
    assert headroom.table(results).filter(pl.col("task") == "chain-sums")["data_headroom_seeds"][0] == 3
