"""Seeds planned before they are spent: the seeds each verdict needs for an effect, projected from the seeds an
experiment has (issue 47, item 2)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from noisy_student_assets.core.environment import EXPERIMENTS
from noisy_student_assets.core.lake_reader import ArmHours, ArmLake
from noisy_student_assets.core.reporting.power import (
    MOST_SEEDS,
    PILOT_SEEDS,
    power_table,
    seed_hours,
    seeds_needed,
)
from noisy_student_assets.core.reporting.verdict import crossed_errors, crossed_interval, widest_interval
from noisy_student_assets.defs.grid import main
from noisy_student_assets.headroom import EXPERIMENT
from tests.conftest import TEST_EXPERIMENTS
from tests.unit.test_headroom import ARMS, _task_seeds


def _differences(seeds: int, seed_sd: float, problems: int = 210) -> np.ndarray:
    rng = np.random.default_rng(seeds)
    difficulty = rng.uniform(0.2, 0.6, problems)
    shift = rng.normal(0, seed_sd, (seeds, 1))
    return (rng.random((seeds, problems)) < difficulty + shift).astype(float) - (
        rng.random((seeds, problems)) < difficulty
    )


def test_the_projection_at_the_seeds_it_has_is_the_verdict_s_own_interval() -> None:
    differences = _differences(3, 0.05)
    assert crossed_errors(differences, 3) == crossed_errors(differences)
    assert widest_interval(differences.mean(), crossed_errors(differences, 3)) == crossed_interval(differences)


def test_the_seeds_needed_are_the_fewest_whose_mde_reaches_the_effect() -> None:
    differences = _differences(3, 0.05)
    small, large = seeds_needed(differences, 0.05), seeds_needed(differences, 0.10)
    assert small is not None and large is not None and small > large >= 2

    def mde(seeds: int) -> float:
        return widest_interval(0.0, crossed_errors(differences, seeds)).mde

    assert mde(small) <= 0.05 < mde(small - 1)


def test_seeds_cannot_beat_the_problems_own_variance() -> None:
    """With no seed spread the problems' variance is what is left: no number of seeds detects a tiny effect."""
    assert seeds_needed(_differences(3, 0.0, problems=20), 0.01) is None


def test_the_table_plans_each_comparison_and_asks_for_a_pilot_first(tmp_path) -> None:
    _task_seeds(tmp_path, "two-digit-sums", gold_gain=0.1)
    _task_seeds(tmp_path, "products", gold_gain=0.1, seeds=PILOT_SEEDS - 1)
    table = power_table(tmp_path, ARMS, [0.05, 0.10], hours_per_seed=2.0)
    rows = {row["group"]: row for row in table.iter_rows(named=True)}
    sums, products = rows["task=two-digit-sums"], rows["task=products"]
    assert sums["checkpoint"] == "gold_label" and sums["seeds"] == 3 and sums["pilot"] == "done"
    assert sums["seeds for 0.05"] >= sums["seeds for 0.1"] >= 2
    assert sums["hours to add for 0.05"] == pytest.approx(max(sums["seeds for 0.05"] - 3, 0) * 2.0)
    assert products["seeds for 0.05"] is None and products["pilot"] == "run 1 more seeds first"


def test_grid_power_without_a_pilot_says_how_many_seeds_it_needs(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    assert main(["power", str(TEST_EXPERIMENTS / "grid.yaml"), "--lake", str(tmp_path / "lake")]) == 0
    assert f"no round evaluated in {tmp_path / 'lake'}; a pilot needs {PILOT_SEEDS} seeds" in capsys.readouterr().out


def test_grid_power_reads_the_cost_of_a_seed_the_grid_recorded_in_a_results_directory(
    tmp_path, monkeypatch, capsys
) -> None:
    """The hours per seed travel with the seeds: what the grid recorded per arm (`record_grid_hours`) is in a results
    directory, and power prints the seeds to add and their hours from it, with no Dagster instance that ran them."""
    from noisy_student_assets.core.lake_reader import export_results

    lake = _task_seeds(tmp_path / "lake", "two-digit-sums", gold_gain=0.1)
    arms = [arm for arm in ARMS if arm.spec.task == "two-digit-sums"]
    for arm, hours in zip(arms, (0.5, 1.0, 1.5), strict=True):
        ArmLake(lake, arm.name).record_grid_hours(ArmHours(experiment="headroom", hours=hours, runs=2))
    results = tmp_path / "results"
    export_results(lake, [arm.name for arm in ARMS], results)
    assert seed_hours(results, ARMS) == {
        (0, 0): 0.5,
        (1, 1): 1.0,
        (2, 2): 1.5,
    }  # one arm of the experiment per seed recorded
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(EXPERIMENTS, str(EXPERIMENT.parent))
    (tmp_path / "home").mkdir()
    assert main(["power", str(EXPERIMENT), "--lake", str(results), "--effect", "0.05", "--effect", "0.1"]) == 0
    printed = capsys.readouterr().out
    assert "| hours to add for 0.05 |" in printed and "| hours to add for 0.1 |" in printed
    assert (
        f"1.00 h per seed (the mean over 3 seeds of the grid's runs of each seed's arms, recorded in {results}"
        in printed
    )
    rows = power_table(results, ARMS, [0.05], hours_per_seed=1.0).filter(pl.col("checkpoint") == "gold_label")
    assert rows["hours to add for 0.05"][0] == float(rows["seeds for 0.05"][0] - 3)


def test_grid_power_says_why_a_piloted_effect_has_no_seeds(tmp_path, monkeypatch, capsys) -> None:
    """An effect that no number of seeds up to `MOST_SEEDS` detects prints n/a, and a line says what that n/a means
    (not a missing pilot)."""
    lake = _task_seeds(tmp_path / "lake", "two-digit-sums", gold_gain=0.1)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(EXPERIMENTS, str(EXPERIMENT.parent))
    (tmp_path / "home").mkdir()
    assert main(["power", str(EXPERIMENT), "--lake", str(lake), "--effect", "0.001", "--effect", "0.5"]) == 0
    printed = capsys.readouterr().out
    assert f"n/a for 0.001 after a pilot: not even {MOST_SEEDS} seeds would detect it" in printed
    assert "n/a for 0.001, 0.5" not in printed


def test_a_new_seed_costs_what_its_arms_read_back_from_one_another(tmp_path) -> None:
    """A new seed of the experiment runs each of its arms at that seed: it costs their hours together (where arms of a
    seed share labeled RL, samples and controls, the first to run pays them and the others read them back, so one
    arm's hours leave them out), not the mean of an arm's."""
    lake = tmp_path / "lake"
    paid_first = {"two-digit-sums": 1.0, "products": 0.25}
    arms = [arm for arm in ARMS if arm.seed in (0, 1) and arm.spec.task in paid_first]
    for arm in arms:
        hours = paid_first[arm.spec.task] * (1 + arm.seed)
        ArmLake(lake, arm.name).record_grid_hours(ArmHours(experiment="headroom", hours=hours, runs=1))
    assert {arm.spec.task for arm in arms} == set(paid_first) and {arm.seed for arm in arms} == {0, 1}
    assert seed_hours(lake, arms) == {(0, 0): pytest.approx(1.25), (1, 1): pytest.approx(2.5)}


def test_the_split_seed_draws_the_split_alone_and_the_seed_everything_else() -> None:
    """Two training seeds on one split: `split_seed` reaches the split and nothing else, `seed` every other stage
    (as it reached the split too where no split_seed is given); both arms pool into one seed group."""
    from noisy_student_assets.core.experiments.arms import (
        EVAL,
        LABELED_ONLY,
        LABELED_RL,
        PROBLEM_SPLIT,
        SAMPLING,
        STUDENT,
        VERIFIER,
        Experiment,
    )
    from noisy_student_assets.core.reporting.summary import group_label, seed_label

    experiment = Experiment.model_validate(
        {
            "name": "split",
            "arms": {"s3-split0": {"seed": 3, "split_seed": 0}, "s4-split0": {"seed": 4, "split_seed": 0}},
        }
    )
    first, second = experiment.all_arms()
    assert first.spec.settings(PROBLEM_SPLIT).seed == second.spec.settings(PROBLEM_SPLIT).seed == 0
    for arm, seed in ((first, 3), (second, 4)):
        assert arm.spec.settings(LABELED_RL).grpo.seed == arm.spec.settings(STUDENT).grpo.seed == seed
        assert arm.spec.settings(LABELED_ONLY).grpo.seed == seed
        assert arm.spec.settings(SAMPLING).seed == arm.spec.settings(VERIFIER).seed == seed
        assert arm.spec.settings(EVAL).seed == seed
        assert (arm.split_seed, arm.seed) == (0, seed) and seed_label(arm) == f"{seed} (split 0)"
    assert group_label(first) == group_label(second) == "defaults"
    (plain,) = Experiment.model_validate({"name": "plain", "arms": {"s5": {"seed": 5}}}).all_arms()
    assert (plain.split_seed, plain.seed, seed_label(plain)) == (5, 5, "5")
