"""Experiment files and arms: parsing, validation, and how an arm's fields map onto the stage settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from noisy_student_assets.core.experiments import arms as experiments
from noisy_student_assets.core.experiments.arms import (
    Arm,
    ArmSpec,
    apply,
    find_arm,
    load_experiment,
    load_experiments,
    max_rounds,
)
from noisy_student_assets.core.settings import (
    LabeledOnlySettings,
    LabeledRLSettings,
    PseudoLabelSettings,
    RoundsSettings,
    StudentSettings,
)
from noisy_student_assets.defs.config import (
    EvalConfig,
    LabeledOnlyConfig,
    LabeledRLConfig,
    ProblemSplitConfig,
    PseudoLabelConfig,
    SamplingConfig,
    StudentConfig,
    with_arm,
)


def _write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(text)
    return path


def test_an_experiment_file_with_defaults_that_arms_override(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "tau",
        "controls: [random_label, labeled_only]\ndefaults: {max_rounds: 3, round_steps: 8, tau: 0.5}\n"
        "arms:\n  low: {seed: 1}\n  high: {seed: 1, tau: 0.8, max_rounds: 4, patience: 1}\n",
    )
    experiment = load_experiment(path)
    low, high = experiment.all_arms()
    assert experiment.name == "tau" and experiment.max_rounds == 4
    assert low.stopping_rule == RoundsSettings(max_rounds=3) and high.stopping_rule == RoundsSettings(
        max_rounds=4, patience=1
    )
    assert experiment.controls == ("labeled_only", "random_label")  # in their canonical order
    assert (low.spec.tau, high.spec.tau, high.spec.round_steps, high.experiment) == (0.5, 0.8, 8, "tau")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("arms: {}\n", "at least one arm"),
        ("rounds: 3\narms:\n  a: {}\n", r"the arm field `max_rounds` now: write `defaults: \{max_rounds: 3\}`"),
        ("arms:\n  a: {patience: 0}\n", "greater than or equal to 1"),
        ("arms:\n  a: {tua: 0.5}\n", "tua"),
        ("arms:\n  a: {tau: 1.5}\n", "less than or equal to 1"),
        ("arms:\n  'a b': {}\n", "arm names must be"),
        ("controls: [gold_label]\narms:\n  a: {}\n", "must include 'labeled_only'"),
        ("controls: [oracle]\narms:\n  a: {}\n", "unknown controls"),
        ("- a\n- b\n", "holds a mapping"),
        ("arms: [\n", "not valid YAML"),
        (
            "controls: [labeled_only, gold_label]\narms:\n  a: {test_time: true}\n",
            r"test-time arms \['a'\] .* would train on eval answers",
        ),
        (
            "controls: [labeled_only, gold_label]\ndefaults: {test_time: true}\narms:\n  a: {}\n",
            "would train on eval answers",
        ),
        (
            "controls: [labeled_only, kept_gold_label]\narms:\n  a: {test_time: true}\n",
            r"'kept_gold_label' control would train on eval answers",
        ),
        (
            "controls: [labeled_only, dose_label]\narms:\n  a: {dose_rho: 0.5}\n  b: {}\n",
            r"'dose_label' control needs each arm's dose_rho; arms \['b'\] set none",
        ),
        ("controls: [labeled_only, dose_label]\narms:\n  a: {dose_rho: 1.5}\n", "less than or equal to 1"),
        (
            "held_out_eval: false\ncontrols: [labeled_only]\narms:\n  a: {test_time: true}\n",
            r"test-time arms \['a'\] train on held-out prompts",
        ),
        (
            "controls: [labeled_only]\ndefaults: {n_unlabeled: 256}\narms:\n  a: {test_time: true}\n",
            "arm a .*n_unlabeled=256 would not be read",
        ),
    ],
)
def test_bad_experiment_files_say_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        load_experiment(_write(tmp_path, "bad", text))
    assert "bad.yaml" in str(error.value)


def test_arm_names_are_unique_across_files_and_found_by_name(tmp_path: Path) -> None:
    _write(tmp_path, "one", "defaults: {max_rounds: 1}\narms:\n  a: {}\n")
    _write(tmp_path, "two", "arms:\n  b: {seed: 2, max_rounds: 4}\n")
    assert max_rounds(load_experiments(tmp_path).values()) == 4 and find_arm(tmp_path, "b").spec.seed == 2
    with pytest.raises(KeyError, match="arm 'c' is declared in no experiment file"):
        find_arm(tmp_path, "c")
    _write(tmp_path, "three", "arms:\n  a: {}\n")
    with pytest.raises(ValueError, match="arm 'a' is declared in both one and three"):
        load_experiments(tmp_path)


def test_each_arm_field_reaches_the_settings_it_names() -> None:
    arm = Arm(
        name="x",
        experiment="e",
        spec=ArmSpec(
            seed=3,
            tau=0.8,
            k=16,
            temperature=0.9,
            student_init="base_model",
            labeled_rl_steps=40,
            round_steps=12,
            eval_samples=0,
        ),
    )
    assert with_arm(PseudoLabelConfig(), arm)[0].tau == 0.8
    sampling = with_arm(SamplingConfig(), arm)[0]
    assert (sampling.k, sampling.temperature, sampling.seed) == (16, 0.9, 3)
    labeled_rl = with_arm(LabeledRLConfig(), arm)[0].grpo
    assert (labeled_rl.max_steps, labeled_rl.seed) == (40, 3)
    full_fine_tuning = with_arm(
        LabeledRLConfig(),
        Arm(name="f", experiment="e", spec=ArmSpec(labeled_rl_lora=False, labeled_rl_learning_rate=1e-5)),
    )[0]
    assert (full_fine_tuning.grpo.use_lora, full_fine_tuning.grpo.learning_rate) == (False, 1e-5)
    assert (
        with_arm(StudentConfig(), Arm(name="f", experiment="e", spec=ArmSpec(labeled_rl_lora=False)))[0]
        == StudentSettings()
    )  # labeled RL's alone
    student = with_arm(StudentConfig(), arm)[0]
    assert (student.student_init, student.grpo.max_steps, student.grpo.seed) == ("base_model", 12, 3)
    assert student.grpo.learning_rate == StudentConfig().grpo.learning_rate  # untouched settings stay
    evaluation = with_arm(EvalConfig(), arm)[0]
    assert (evaluation.samples, evaluation.ks, evaluation.seed) == (0, [], 3)
    assert with_arm(EvalConfig(), Arm(name="y", experiment="e", spec=ArmSpec(eval_samples=4)))[0].ks == [1, 4]


def test_the_student_variant_fields_reach_the_student_and_its_controls_only() -> None:
    arm = Arm(
        name="x",
        experiment="e",
        spec=ArmSpec(
            mode="dpo",
            agreement_low=0.5,
            agreement_high=0.9,
            prompt_noise=True,
            dropout=0.1,
            dpo_beta=0.3,
            sft_samples_per_problem=2,
        ),
    )
    student = with_arm(StudentConfig(), arm)[0]
    assert (student.mode, student.agreement_low, student.agreement_high, student.prompt_noise) == (
        "dpo",
        0.5,
        0.9,
        True,
    )
    assert (student.model_dropout, student.grpo.lora_dropout, student.dpo_beta, student.sft_samples_per_problem) == (
        0.1,
        0.1,
        0.3,
        2,
    )
    assert (
        with_arm(StudentConfig(), Arm(name="y", experiment="e", spec=ArmSpec(reward="vote_share")))[0].reward
        == "vote_share"
    )
    assert with_arm(LabeledOnlyConfig(), arm)[0] == LabeledOnlySettings()  # the control trains as it always does
    assert with_arm(LabeledRLConfig(), arm)[0] == LabeledRLSettings()
    with pytest.raises(ValueError, match="GRPO reward"):
        with_arm(StudentConfig(), Arm(name="z", experiment="e", spec=ArmSpec(mode="sft", reward="vote_share")))
    with pytest.raises(ValueError):
        ArmSpec(mode="ppo")


def test_the_data_size_fields_reach_the_split_and_every_round_s_training() -> None:
    arm = Arm(
        name="x", experiment="e", spec=ArmSpec(n_labeled=16, n_unlabeled=512, prompts_per_step=8, pseudo_only=True)
    )
    split = with_arm(ProblemSplitConfig(), arm)[0]
    assert (split.n_labeled, split.n_unlabeled, split.n_validation) == (16, 512, ProblemSplitConfig().n_validation)
    student = with_arm(StudentConfig(), arm)[0]
    control = with_arm(LabeledOnlyConfig(), arm)[0]
    assert student.grpo.prompts_per_step == control.grpo.prompts_per_step == 8 and student.pseudo_only
    assert with_arm(LabeledRLConfig(), arm)[0] == LabeledRLSettings()  # labeled RL is chosen on validation, apart
    with pytest.raises(ValueError):
        ArmSpec(n_labeled=0)
    assert (
        with_arm(ProblemSplitConfig(), Arm(name="t", experiment="e", spec=ArmSpec(test_time=True)))[0].test_time
        and not split.test_time
    )
    with pytest.raises(ValueError, match="would not be read"):
        ArmSpec(test_time=True, n_unlabeled=105)


def test_an_arm_overrules_the_run_config_and_says_so() -> None:
    arm = Arm(name="x", experiment="e", spec=ArmSpec(tau=0.8))
    config, replaced = with_arm(PseudoLabelConfig(tau=0.6, min_coverage=0.2), arm)
    assert (config.tau, config.min_coverage) == (0.8, 0.2) and replaced == ["tau=0.6 -> 0.8"]
    assert with_arm(PseudoLabelConfig(), arm)[1] == []  # a default the arm replaces is not news
    assert with_arm(PseudoLabelConfig(tau=0.6), None) == (PseudoLabelSettings(tau=0.6), [])


def test_an_arms_stage_fingerprint_changes_only_with_what_it_changes_in_that_stage() -> None:
    low = Arm(name="x", experiment="e", spec=ArmSpec(tau=0.5, seed=1))
    high = Arm(name="x", experiment="e", spec=ArmSpec(tau=0.8, seed=1))
    assert low.overrides_sha(experiments.PSEUDO_LABELS) != high.overrides_sha(experiments.PSEUDO_LABELS)
    for stage in (experiments.SAMPLING, experiments.STUDENT, experiments.LABELED_RL, experiments.PROBLEM_SPLIT):
        assert low.overrides_sha(stage) == high.overrides_sha(stage)
    with pytest.raises(ValueError, match="unknown stage"):
        low.overrides("vote")


def test_apply_merges_nested_settings() -> None:
    assert apply({"a": 1, "grpo": {"seed": 0, "beta": 0.1}}, {"grpo": {"seed": 5}}) == {
        "a": 1,
        "grpo": {"seed": 5, "beta": 0.1},
    }
