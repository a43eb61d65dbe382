"""The headroom table (no model: the lake is written by hand in the layout the assets publish), and the tasks an arm
can name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import Arm, ArmSpec, Experiment, load_experiment
from noisy_student_assets.core.experiments.passes import arm_passes
from noisy_student_assets.core.experiments.tasks import load_tasks
from noisy_student_assets.core.problems import load_problems
from noisy_student_assets.core.reporting.headroom import grid_task, headroom_table, headroom_verdict, regime, task_row
from noisy_student_assets.core.settings import CPU_EVAL_SOURCE, CPU_TRAINING_SOURCE
from noisy_student_assets.core.training.grpo import ANSWER_REWARD_LOGGED, saturation_step, saturation_summary
from noisy_student_assets.defs.config import ProblemPoolConfig, with_arm
from noisy_student_assets.headroom import EXPERIMENT
from tests.unit.test_summary import write_audit

PROBLEMS = 60
ARMS = load_experiment(EXPERIMENT).all_arms()


def _arms(task: str) -> list:
    return [arm for arm in ARMS if arm.spec.task == task]


def _eval(lake: Path, key_path, arm: str, correct: np.ndarray) -> None:
    directory = layout.artifact_dir(lake, key_path, arm)
    directory.mkdir(parents=True)
    metrics = {"greedy_accuracy": float(correct.mean()), "problems": float(correct.size)}
    (directory / layout.METRICS_FILE).write_text(json.dumps({"metrics": metrics}))
    ids = [f"p{i:02d}" for i in range(correct.size)]
    pl.DataFrame({"problem_id": ids, "greedy_correct": correct.astype(bool)}).write_parquet(
        directory / layout.SCORES_FILE
    )


def _task_seeds(lake: Path, task: str, gold_gain: float, seeds: int = 3) -> Path:
    """Per seed of `task`: labeled RL right on 0.4 of validation, its votes right on 0.5 of the unlabeled problems
    and one sample on 0.7; gold labels right on `gold_gain` more held-out problems than labeled-only (give or take a
    seed)."""
    rng = np.random.default_rng(0)
    for arm in _arms(task)[:seeds]:
        _eval(lake, layout.LABELED_RL_VALIDATION, arm.name, np.arange(100) < 40)
        write_audit(lake, arm.name, teacher_maj_at_k=0.5, teacher_pass_at_k=0.7)
        labeled_only = rng.random(PROBLEMS) < 0.4
        gained = labeled_only | (rng.random(PROBLEMS) < gold_gain)
        _eval(lake, layout.round_asset(1, layout.control_eval(layout.LABELED_ONLY)), arm.name, labeled_only)
        _eval(lake, layout.round_asset(1, layout.control_eval(layout.GOLD_LABEL)), arm.name, gained)
    return lake


def test_a_shipped_task_is_the_cpu_profile_s_sources_with_its_own_generator() -> None:
    tasks = load_tasks()
    shipped = ["two-digit-sums", "chain-sums", "products"]
    assert list(tasks) == [*shipped, "gsm8k-slice"], "the shipped tasks, then the test experiments' own"
    assert tasks["two-digit-sums"].training_source == CPU_TRAINING_SOURCE
    held_out = tasks["chain-sums"].eval_source
    assert (held_out.name, held_out.size, held_out.seed) == ("chain_sum", 280, CPU_EVAL_SOURCE.seed)
    assert tasks["products"].eval_source.size == CPU_EVAL_SOURCE.size
    problems = load_problems(**held_out.load_kwargs())
    assert problems.height == 280 and "-" in " ".join(problems["prompt"])


def test_an_arm_s_task_and_model_are_its_problems_and_base_model_settings() -> None:
    spec = ArmSpec(task="chain-sums", base_model="/models/other", seed=3)
    tasks = load_tasks()
    assert spec.settings("problem_pool").resolved_source == tasks["chain-sums"].training_source
    assert spec.settings("eval_problems").resolved_source == tasks["chain-sums"].eval_source
    assert spec.settings("base_model").reference == "/models/other"
    assert spec.settings("problem_split").seed == 3, "the seed draws the split, never the task's problems"
    assert ArmSpec().overrides("problem_pool") == {}, "no task: the profile's pool"
    run_config = ProblemPoolConfig(source=CPU_TRAINING_SOURCE.model_dump() | {"size": 40})
    arm = Experiment(name="e", arms={"chains": spec}).arm("chains")
    settings, replaced = with_arm(run_config, arm)
    assert settings.resolved_source == tasks["chain-sums"].training_source, "the task replaces the run config's source"
    assert "source.size=40 -> 1000" in replaced
    with pytest.raises(ValueError, match=r"no task 'sums' in .*the tasks: two-digit-sums, chain-sums, products"):
        ArmSpec(task="sums")


def test_a_task_row_has_both_headrooms_over_its_seeds(tmp_path: Path) -> None:
    row = task_row("products", _task_seeds(tmp_path, "products", gold_gain=0.5), _arms("products"))
    assert row["seeds"] == 3 and row["teacher_validation_greedy"] == pytest.approx(0.4)
    assert row["label_headroom"] == pytest.approx(0.2) and row["maj_at_k"] == pytest.approx(0.5)
    assert row["gold_label"] - row["labeled_only"] == pytest.approx(row["data_headroom"])
    assert row["data_headroom_low"] > 0 and row["outcome"] == "better" and row["data_headroom_seeds"] == 3
    empty = task_row("products", tmp_path / "not-run", _arms("products"))
    assert empty["seeds"] == 0 and empty["outcome"] == "not run" and empty["label_headroom"] is None


def test_the_grid_takes_the_task_with_data_headroom_and_the_most_label_headroom(tmp_path: Path) -> None:
    """One lake holds every task's arms; the table groups them by the task they name."""
    _task_seeds(tmp_path, "two-digit-sums", gold_gain=0.0)
    _task_seeds(tmp_path, "chain-sums", gold_gain=0.5)
    _task_seeds(tmp_path, "products", gold_gain=0.5, seeds=2)  # 2 seeds: not enough
    table = headroom_table(tmp_path, ARMS)
    assert table["task"].to_list() == ["two-digit-sums", "chain-sums", "products"]
    assert table["seeds"].to_list() == [3, 3, 2]
    assert table["outcome"].to_list()[:2] == ["inconclusive", "better"]
    assert table["data_headroom_mde"][1] > table["data_headroom_high"][1] - table["data_headroom"][1]
    assert headroom_verdict(table.filter(pl.col("task") != "chain-sums")).startswith(
        "No task shows data headroom (gold labels beating labeled-only on 3 seeds); two-digit-sums: inconclusive: "
        f"could have missed an effect up to {table['data_headroom_mde'][0]:.3f} (3 seeds)"
    )
    assert grid_task(table) == "chain-sums"
    margined = load_experiment(EXPERIMENT).model_copy(update={"equivalence_margin": 0.05}).all_arms()
    row = task_row("two-digit-sums", tmp_path, [arm for arm in margined if arm.spec.task == "two-digit-sums"])
    assert row["outcome"] == "no effect larger than 0.05"  # gold labels gained nothing: the interval is 0 to 0
    assert grid_task(table.filter(pl.col("task") != "chain-sums")) is None


def test_the_committed_results_print_the_table(capsys) -> None:
    """`python -m noisy_student_assets.headroom --lake results`: the table of docs/results.md, from the results."""
    from noisy_student_assets import headroom

    assert headroom.main(["--lake", str(Path(__file__).resolve().parents[2] / "results")]) == 0
    printed = capsys.readouterr().out
    assert (
        "| two-digit-sums | defaults | 3 | 0.497 | 0.469 | 0.682 | 0.214 | 2 | 2 | 0.4 | 0.594 | 0.608 | 0.014 |"
        in printed
    )
    assert "No task has data headroom" not in printed
    assert "two-digit-sums: inconclusive: could have missed an effect up to" in printed


def test_an_edited_tasks_file_is_read_again(tmp_path: Path) -> None:
    """The tasks are parsed once per version of their file: an edit is seen by the next read."""
    import os

    tasks_file = tmp_path / "mine.yaml"
    tasks_file.write_text("sums: {name: basic_arithmetic, eval_candidates: 100}\n")
    assert load_tasks([tmp_path])["sums"].eval_source.size == 100
    tasks_file.write_text("sums: {name: basic_arithmetic, eval_candidates: 300}\n")
    modified = tasks_file.stat().st_mtime_ns + 1_000_000  # a later version, however coarse the filesystem's clock
    os.utime(tasks_file, ns=(modified, modified))
    assert load_tasks([tmp_path])["sums"].eval_source.size == 300


PASSES = load_experiment(EXPERIMENT.parent / "passes.yaml")


def _training_log(lake: Path, arm: str, rewards: list[float]) -> None:
    """The labeled-only control's checkpoint as the trainer leaves its step log (`layout.TRAINING_LOG_FILE`)."""
    directory = layout.artifact_dir(lake, layout.round_asset(1, layout.control_checkpoint(layout.LABELED_ONLY)), arm)
    directory.mkdir(parents=True)
    log = [{"step": step, ANSWER_REWARD_LOGGED: reward, "loss": 0.0} for step, reward in enumerate(rewards, 1)]
    (directory / layout.TRAINING_LOG_FILE).write_text(json.dumps([*log, {"train_runtime": 1.0}]))


def test_each_run_s_passes_are_its_prompts_over_its_distinct_problems() -> None:
    """headroom.yaml: 8 steps x 4 prompts over 16 labels (2 passes) and over 16 + 64 problems (0.4); labeled RL 16
    steps x 2 prompts over the 16 labels."""
    assert arm_passes(ARMS[0]) == {"labeled_rl": 2.0, "labeled_only": 2.0, "gold_label": 0.4}


def test_the_passes_experiment_outruns_the_labels_and_not_the_gold_labels() -> None:
    """The regime issue 47 asks for: labeled-only cycles its labels ten times or more, the gold-label control sees
    each of its problems about twice at most, at the same prompts in every regime, 5 seeds of each."""
    arms = PASSES.all_arms()
    passes = {arm.name: arm_passes(arm) for arm in arms}
    assert all(run["labeled_only"] >= 10 and run["gold_label"] <= 2 for run in passes.values())
    prompts = {arm.spec.round_steps * arm.spec.prompts_per_step for arm in arms}
    assert prompts == {96}
    regimes = {regime(arm) for arm in arms}
    assert regimes == {"n_labeled=2", "n_labeled=4", "n_labeled=8"}
    assert all(sum(regime(arm) == name for arm in arms) >= 5 for name in regimes)
    assert PASSES.equivalence_margin == 0.05


def test_the_reward_saturates_where_its_4_step_mean_reaches_0_9() -> None:
    rising = [0.5, 0.8, 0.9, 1.0, 1.0, 0.9, 1.0, 1.0]
    assert saturation_step(rising) == 5  # 0.8, 0.9, 1.0, 1.0: 0.925
    assert saturation_step(rising[:4]) is None and saturation_summary(rising) == "step 5 of 8"
    assert saturation_summary([0.5] * 6) == "not in 6 steps (last 4-step mean 0.50)"


def test_the_table_has_one_line_per_regime_with_its_passes_and_saturation(tmp_path: Path) -> None:
    arms = [arm for arm in PASSES.all_arms() if arm.spec.seed < 3]
    rng = np.random.default_rng(1)
    for arm in arms:
        _eval(tmp_path, layout.LABELED_RL_VALIDATION, arm.name, np.arange(100) < 40)
        write_audit(tmp_path, arm.name, teacher_maj_at_k=0.5, teacher_pass_at_k=0.7)
        for control in (layout.LABELED_ONLY, layout.GOLD_LABEL):
            _eval(tmp_path, layout.round_asset(1, layout.control_eval(control)), arm.name, rng.random(PROBLEMS) < 0.5)
        if arm.spec.n_labeled == 2:  # the fewest labels are learnt by step 5 on seeds 0 and 1
            _training_log(tmp_path, arm.name, [0.6, 0.8, 1.0, 1.0, 1.0, 1.0] if arm.spec.seed < 2 else [0.6] * 6)
    table = headroom_table(tmp_path, arms)
    assert table["regime"].to_list() == ["n_labeled=2", "n_labeled=4", "n_labeled=8"]
    assert table["labeled_only_passes"].to_list() == [48.0, 24.0, 12.0]
    assert table["seeds"].to_list() == [3, 3, 3]
    assert table["labeled_only_saturated"].to_list() == ["2 of 3 (steps 5, 5 of 6)", "not logged", "not logged"]
    assert "two-digit-sums n_labeled=4: " in headroom_verdict(table)


def test_the_label_sources_students_run_in_the_regime_the_rule_picks_from_results_on_the_passes_arms_settings() -> None:
    """passes_label_sources.yaml: each seed's three students beside the passes experiment's arm of the same seed in
    the regime `grid_task` picks from the committed results, with its settings but the label source, so that they
    read back its labeled RL, samples and controls."""
    students = load_experiment(EXPERIMENT.parent / "passes_label_sources.yaml")
    results = Path(__file__).resolve().parents[2] / "results"
    n_labeled = students.defaults.n_labeled
    assert grid_task(headroom_table(results, PASSES.all_arms())) == f"two-digit-sums n_labeled={n_labeled}"
    twins = _assert_each_arm_is_its_passes_twin_but(students, {"label_source"})
    sources: dict[int, set[str]] = {}
    for arm in students.all_arms():
        sources.setdefault(arm.spec.seed, set()).add(arm.label_source)
    assert sources == {seed: {"majority", "confidence", "verifier"} for seed in twins}
    assert students.controls == PASSES.controls and students.equivalence_margin == PASSES.equivalence_margin


def test_the_peers_variants_run_beside_the_label_sources_students_on_the_passes_arms_settings() -> None:
    """passes_peers.yaml: TTRL's reward and TraPO's unlabeled share on each seed's majority student, with the passes
    arm's settings but what only the pseudo-labels and the student read (so that labeled RL, the samples and the
    labeled-only control are read back), against labeled-only alone: neither has a gold-label counterpart."""
    peers = load_experiment(EXPERIMENT.parent / "passes_peers.yaml")
    twins = _assert_each_arm_is_its_passes_twin_but(peers, {"label_source", "tau", "reward", "unlabeled_share"})
    variants: dict[int, set[str]] = {}
    for arm in peers.all_arms():
        assert arm.label_source == "majority"
        variants.setdefault(arm.spec.seed, set()).add(
            "ttrl" if arm.spec.reward == "group_majority" else f"share {arm.spec.unlabeled_share}"
        )
    assert variants == {seed: {"ttrl", "share 0.75"} for seed in twins}
    assert peers.controls == ("labeled_only",) and peers.equivalence_margin == PASSES.equivalence_margin


def _assert_each_arm_is_its_passes_twin_but(experiment: Experiment, student_only: set[str]) -> dict[int, Arm]:
    """Each arm of `experiment` has the settings of the passes arm of its seed with the same labeled set's size, but
    `student_only` (what only the pseudo-labels and the student read); the twins by seed."""
    twins = {arm.spec.seed: arm for arm in PASSES.all_arms() if arm.spec.n_labeled == experiment.defaults.n_labeled}
    for arm in experiment.all_arms():
        own, twin = (spec.model_dump(exclude=student_only) for spec in (arm.spec, twins[arm.spec.seed].spec))
        assert own == twin, arm.name
    return twins


@pytest.mark.parametrize(
    ("entry", "refused"),
    [
        ("{pool: {kind: gsm8k, split: train}}", "gives pool alone"),
        ("{name: chain_sum, pool: {kind: gsm8k}, held_out: {kind: gsm8k, split: test}}", "name belong to the short"),
    ],
)
def test_a_task_gives_both_sources_or_the_short_form(tmp_path: Path, entry: str, refused: str) -> None:
    (tmp_path / "mine.yaml").write_text(f"words: {entry}\n")
    with pytest.raises(ValueError, match=refused):
        load_tasks([tmp_path])
