"""Results across seeds, from lakes written by hand (the runs themselves are the main job's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.seeds import collect, report, seed_config


def _lake(root: Path, seed: int, accuracies: dict[str, float], label_accuracy: float) -> None:
    assets = {"base_model": "base_model_eval", "labeled_rl": "labeled_rl_eval", "gold_label_rl": "gold_label_rl_eval",
              "round-001": "eval_report/round-001"}
    for name, accuracy in accuracies.items():
        directory = root / f"seed-{seed}" / assets[name]
        directory.mkdir(parents=True)
        (directory / "metrics.json").write_text(json.dumps({"metrics": {"greedy_accuracy": accuracy, "problems": 210.0}}))
    audit = root / f"seed-{seed}" / "pseudo_labels" / "round-001"
    audit.mkdir(parents=True)
    (audit / "audit.json").write_text(json.dumps(
        {"tau": 0.5, "coverage": 0.5, "kept": 32.0, "mean_agreement": 0.5, "kept_label_accuracy": label_accuracy,
         "all_label_accuracy": 0.5, "teacher_pass_at_1": 0.4}
    ))


@pytest.fixture
def seeds_dir(tmp_path: Path) -> Path:
    _lake(tmp_path, 0, {"base_model": 0.1, "labeled_rl": 0.3, "round-001": 0.35, "gold_label_rl": 0.5}, 0.8)
    _lake(tmp_path, 1, {"base_model": 0.1, "labeled_rl": 0.2, "round-001": 0.4, "gold_label_rl": 0.4}, 0.6)
    return tmp_path


def test_collect_keeps_every_seed_and_the_share_of_the_gold_gain(seeds_dir: Path) -> None:
    accuracy, rounds = collect(seeds_dir)
    assert accuracy.height == 8 and set(accuracy["seed"]) == {"0", "1"}
    shares = dict(rounds.select("seed", "share_of_gold_gain").iter_rows())
    assert shares["0"] == pytest.approx(0.25) and shares["1"] == pytest.approx(1.0)


def test_report_gives_mean_and_sd_and_writes_the_figure(seeds_dir: Path) -> None:
    text = report(seeds_dir)
    assert "held-out problems: 210" in text
    assert "| round-001 | 0.375 ± 0.035 (n=2) |" in text  # mean 0.375, sd of (0.35, 0.4)
    assert "| round-001 | 0.5 ± 0.0 (n=2) | 0.7 ± 0.141 (n=2) |" in text  # coverage, kept label accuracy
    assert (seeds_dir / "accuracy_by_checkpoint.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((seeds_dir / "results.json").read_text())["accuracy"][0]["seed"] == "0"


def test_a_seed_sets_every_random_choice_but_not_the_eval_set() -> None:
    first, second = seed_config(0, 220), seed_config(1, 220)
    assert first["foundation"]["eval_problems"] == second["foundation"]["eval_problems"]
    assert first["foundation"]["eval_problems"]["config"]["source"]["size"] == 220
    for group, op in [("foundation", "problem_split"), ("foundation", "labeled_rl_checkpoint"),
                      ("foundation", "gold_label_rl_checkpoint"), ("round", "noisy_student_round"), ("round", "eval_report")]:
        assert first[group][op] != second[group][op], op


def test_greedy_only_drops_the_sampled_eval_everywhere() -> None:
    config = seed_config(0, 220, greedy_only=True)
    evals = [config["foundation"][op]["config"] for op in ("base_model_eval", "labeled_rl_eval", "gold_label_rl_eval")]
    for settings in [*evals, config["round"]["eval_report"]["config"]]:
        assert (settings["samples"], settings["ks"], settings["seed"]) == (0, [], 0)
