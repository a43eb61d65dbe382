"""GRPO training without a model: the training set's construction, the reward functions, and the setup every
trainer shares (tests/model/test_grpo.py trains a tiny model)."""

from __future__ import annotations

import json

import datasets
import polars as pl
import pytest

from noisy_student_assets.core.layout import GOLD_LABEL, LABELED_ONLY
from noisy_student_assets.core.prompts import NOISY_TEMPLATES, build_messages, prompt_template
from noisy_student_assets.core.pseudo_labels.student_data import labeled_rows
from noisy_student_assets.core.settings import TRL_ROLLOUTS, GRPOSettings, StudentSettings
from noisy_student_assets.core.training.base import GOLD, PSEUDO, Lora, Rows, TrainerSetup
from noisy_student_assets.core.training.grpo import (
    MajorityGate,
    answer_reward,
    build_training_dataset,
    format_reward_fn,
    group_majority_reward,
    vote_share_reward,
)
from noisy_student_assets.core.training.modes.registry import student_mode_for
from tests.training_data import SEVEN, SYSTEM_PROMPT, labeled_frame, pseudo_frame


@pytest.fixture(scope="module")
def training_set():
    return build_training_dataset(labeled_frame(), pseudo_frame(), SYSTEM_PROMPT)


# --- training set ---------------------------------------------------------------------------------


def test_dataset_mixes_every_labeled_and_pseudo_labeled_row():
    dataset = build_training_dataset(labeled_frame(3), pseudo_frame(5), SYSTEM_PROMPT)
    assert dataset.column_names == ["prompt", "target", "label_source", "problem_id"]
    rows = {row["problem_id"]: row for row in dataset}
    assert len(dataset) == 8
    assert sorted(rows) == sorted([f"gold-{i}" for i in range(3)] + [f"pseudo-{i}" for i in range(5)])
    assert {row["label_source"] for pid, row in rows.items() if pid.startswith("gold")} == {"gold"}
    assert {row["label_source"] for pid, row in rows.items() if pid.startswith("pseudo")} == {"pseudo"}
    assert rows["gold-2"]["prompt"] == build_messages("What is 2 + 7 - 2?", SYSTEM_PROMPT)


def test_a_pseudo_only_student_trains_on_the_pseudo_labeled_rows_alone():
    dataset = build_training_dataset(labeled_rows(labeled_frame(3), pseudo_only=True), pseudo_frame(5), SYSTEM_PROMPT)
    assert sorted(dataset["problem_id"]) == [f"pseudo-{i}" for i in range(5)] and set(dataset["label_source"]) == {
        "pseudo"
    }
    assert labeled_rows(labeled_frame(3), pseudo_only=False).equals(labeled_frame(3))


def test_an_unlabeled_share_sets_the_run_s_prompts_cycling_each_part():
    """32 labeled with 96 unlabeled, as TraPO mixes them, from 3 labeled and 5 pseudo-labeled problems: each part's
    problems come round in turn, so none is drawn twice before every other one of its part was."""
    dataset = build_training_dataset(
        labeled_frame(3), pseudo_frame(5), SYSTEM_PROMPT, unlabeled_share=0.75, prompts=128, seed=3
    )
    ids = pl.Series(dataset["problem_id"])
    assert len(dataset) == 128 and dataset["label_source"].count(PSEUDO) == 96
    for part, counts in (("gold", [10, 11, 11]), ("pseudo", [19, 19, 19, 19, 20])):  # 32 = 3 x 10 + 2, 96 = 5 x 19 + 1
        assert sorted(ids.filter(ids.str.starts_with(part)).value_counts()["count"]) == counts
    again = build_training_dataset(
        labeled_frame(3), pseudo_frame(5), SYSTEM_PROMPT, unlabeled_share=0.75, prompts=128, seed=3
    )
    assert again["problem_id"] == dataset["problem_id"], "the same seed, the same prompts in the same order"


def test_an_unlabeled_share_without_pseudo_labels_or_in_another_mode_is_refused():
    with pytest.raises(ValueError, match="asks for 6 pseudo-labeled prompts, and there are no pseudo-labeled rows"):
        build_training_dataset(labeled_frame(3), None, SYSTEM_PROMPT, unlabeled_share=0.75, prompts=8)
    with pytest.raises(ValueError, match="leaves no unlabeled_share"):
        StudentSettings(pseudo_only=True, unlabeled_share=0.5)
    with pytest.raises(ValueError, match="unlabeled_share sets a GRPO run's prompts; mode 'sft'"):
        student_mode_for(StudentSettings(mode="sft", unlabeled_share=0.5))
    shared = StudentSettings(unlabeled_share=0.5)
    assert student_mode_for(shared).admits(LABELED_ONLY, shared)
    assert not student_mode_for(shared).admits(GOLD_LABEL, shared), "its rows cannot keep the student's share"


def test_targets_are_gold_answers_and_pseudo_labels():
    labeled = labeled_frame(2).with_columns(gold_answer=pl.Series(["10", "11"]))
    pseudo = pseudo_frame(2).with_columns(pseudo_label=pl.Series(["20", "21"]))
    targets = {row["problem_id"]: row["target"] for row in build_training_dataset(labeled, pseudo, SYSTEM_PROMPT)}
    assert targets == {"gold-0": "10", "gold-1": "11", "pseudo-0": "20", "pseudo-1": "21"}


def test_without_pseudo_labels_only_labeled_rows():
    dataset = build_training_dataset(labeled_frame(3), None, SYSTEM_PROMPT)
    assert list(dataset["label_source"]) == ["gold"] * 3


def test_shuffle_is_deterministic_in_the_seed():
    def order(seed: int) -> list[str]:
        dataset = build_training_dataset(labeled_frame(10), pseudo_frame(10), SYSTEM_PROMPT, seed=seed)
        return list(dataset["problem_id"])

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert order(0) != sorted(order(0))  # shuffled, not concatenated


def test_no_other_column_of_the_pseudo_labels_reaches_training():
    poisoned = pseudo_frame().with_columns(hidden_gold_answer=pl.lit("999"), gold_answer=pl.lit("999"))
    clean = build_training_dataset(labeled_frame(), pseudo_frame(), SYSTEM_PROMPT)
    assert build_training_dataset(labeled_frame(), poisoned, SYSTEM_PROMPT).to_list() == clean.to_list()


def test_empty_training_set_is_rejected():
    with pytest.raises(ValueError, match="no training rows"):
        build_training_dataset(labeled_frame(0), pseudo_frame(0), SYSTEM_PROMPT)


def test_missing_target_names_the_row():
    pseudo = pseudo_frame(2).with_columns(pseudo_label=pl.Series([SEVEN, None], dtype=pl.String))
    with pytest.raises(ValueError, match="pseudo-1"):
        build_training_dataset(labeled_frame(), pseudo, SYSTEM_PROMPT)


# --- settings and TRL config ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"num_generations": 1},
        {"loss_type": "ppo"},
        {"scale_rewards": "std"},
        {"processes": 3},  # a step of 16 completions cannot be split over 3 processes
        {"dynamic_sampling_replacements": 2, "processes": 2, "rollouts": TRL_ROLLOUTS},
        {"rollouts": "sglang"},
        {"rollouts": "vllm", "processes": 2},
        {"rollouts": "vllm", "use_vllm": True},
    ],
)
def test_invalid_settings_are_rejected(change):
    with pytest.raises(ValueError):
        GRPOSettings(**change)


def test_a_student_s_setup_is_its_grpo_settings_with_its_dropout_noise():
    budget = dict(max_steps=7, learning_rate=3e-4, seed=5, save_steps=2, gradient_accumulation_steps=2, processes=2)
    sampling = dict(rollouts=TRL_ROLLOUTS)  # one vLLM engine cannot serve two processes
    guards = dict(gradient_checkpointing=True, max_consecutive_skipped_steps=4)
    lora = dict(lora_r=4, lora_alpha=8, lora_dropout=0.1, lora_target_modules=["q_proj"])
    settings = GRPOSettings(**budget, **sampling, **guards, **lora, use_lora=True)
    expected = TrainerSetup(**budget, **guards, lora=Lora(4, 8, 0.1, ["q_proj"]), model_dropout=0.2)
    assert TrainerSetup.for_student(settings, model_dropout=0.2) == expected
    assert TrainerSetup.for_student(settings.model_copy(update={"use_lora": False})).lora is None


@pytest.mark.parametrize(
    ("rows", "n_rows", "message"),
    [
        (Rows(5, "pairs", PSEUDO), 12, "5 rows a step cannot be split over 2 processes"),
        (Rows(8, "completions", PSEUDO), 7, "7 training rows cannot fill a step of 8 completions"),
        (Rows(8, "prompts", None, needed=2), 1, "1 training rows cannot fill a step of 2 prompts"),
        (Rows(8, "pairs", GOLD, needed=1), 0, "no training rows"),
    ],
)
def test_the_step_budget_is_checked_before_any_model_loads(rows: Rows, n_rows: int, message: str):
    setup = TrainerSetup.for_student(GRPOSettings(gradient_accumulation_steps=2, processes=2, rollouts=TRL_ROLLOUTS))
    with pytest.raises(ValueError, match=message):
        setup.check_budget(rows, datasets.Dataset.from_list([{"row": index} for index in range(n_rows)]))
    setup.check_budget(Rows(8, "pairs", GOLD, needed=1), datasets.Dataset.from_list([{"row": 0}]))


def test_a_step_too_small_for_its_micro_batches_is_split_into_fewer():
    setup = TrainerSetup.for_student(GRPOSettings(gradient_accumulation_steps=4, processes=2, rollouts=TRL_ROLLOUTS))
    assert setup.micro_batches(Rows(16, "completions", PSEUDO)) == 4
    assert setup.micro_batches(Rows(4, "pairs", PSEUDO)) == 2  # 2 pairs a process
    assert setup.micro_batches(Rows(6, "pairs", PSEUDO)) == 1  # 3 pairs a process split evenly only whole


# --- rewards --------------------------------------------------------------------------------------


def test_answer_reward_grades_plain_and_conversational_completions():
    plain = ["so the answer is \\boxed{12}", "\\boxed{13}", "no idea"]
    conversational = [[{"role": "assistant", "content": text}] for text in plain]
    targets = ["12", "12", "12"]
    assert answer_reward(plain, targets) == [1.0, 0.0, 0.0]
    assert answer_reward(conversational, targets) == [1.0, 0.0, 0.0]


def test_answer_reward_logs_the_mean_per_label_source():
    logged = {}
    answer_reward(
        ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}"],
        ["1", "1", "3"],
        label_source=["gold", "gold", "pseudo"],
        log_metric=logged.__setitem__,
    )
    assert logged == {"answer_reward/gold": 0.5, "answer_reward/pseudo": 1.0, "answer_reward/ungraded_share": 0.0}


def test_an_ungraded_answer_gets_no_reward_and_is_counted(ungraded_pair):
    target, slow_to_compare = ungraded_pair
    logged = {}
    rewards = answer_reward(
        [f"\\boxed{{{target}}}", f"\\boxed{{{slow_to_compare}}}", "\\boxed{x}"],
        [target, target, target],
        label_source=["gold", "gold", "pseudo"],
        log_metric=logged.__setitem__,
    )
    assert rewards == [1.0, None, 0.0]
    assert logged == {"answer_reward/gold": 1.0, "answer_reward/pseudo": 0.0, "answer_reward/ungraded_share": 1 / 3}


def test_format_reward_is_independent_of_correctness():
    completions = ["\\boxed{13}", [{"role": "assistant", "content": "it is 12"}]]
    assert format_reward_fn(completions, target=["12", "12"]) == [1.0, 0.0]


# --- the student's prompt noise and soft reward ---------------------------------------------------


def test_prompt_noise_renders_prompts_through_seeded_templates():
    def prompts(seed: int, noise: bool) -> dict[str, str]:
        dataset = build_training_dataset(labeled_frame(12), None, "", seed=seed, prompt_noise=noise)
        return {row["problem_id"]: row["prompt"][-1]["content"] for row in dataset}

    plain, noisy = prompts(0, False), prompts(0, True)
    assert plain == {f"gold-{i}": build_messages(f"What is {i} + 7 - {i}?")[0]["content"] for i in range(12)}
    assert noisy == prompts(0, True) and noisy != prompts(1, True)
    used = {
        template
        for template in range(len(NOISY_TEMPLATES))
        for pid, text in noisy.items()
        if text
        == build_messages(f"What is {pid.split('-')[1]} + 7 - {pid.split('-')[1]}?", template=template)[0]["content"]
    }
    assert len(used) > 1
    assert all("\\boxed{}" in template for template in NOISY_TEMPLATES)
    assert NOISY_TEMPLATES[0] == json.loads(prompt_template())[0]["content"]  # template 0 is every stage's format


def test_vote_share_reward_pays_the_answer_s_share_of_the_votes_and_gold_rows_hard():
    shares = json.dumps([["12", 0.625], ["13", 0.25]])
    completions = ["\\boxed{12}", "\\boxed{13}", "\\boxed{14}", "no answer", "\\boxed{5}", "\\boxed{6}"]
    targets = ["12", "12", "12", "12", "5", "5"]
    vote_shares = [shares] * 4 + ["[]", "[]"]
    logged = {}
    rewards = vote_share_reward(
        completions, targets, vote_shares, label_source=["pseudo"] * 4 + ["gold"] * 2, log_metric=logged.__setitem__
    )
    assert rewards == [0.625, 0.25, 0.0, 0.0, 1.0, 0.0]
    assert logged == {  # agreement with the label, as before
        "answer_reward/gold": 0.5,
        "answer_reward/pseudo": 0.25,
        "answer_reward/ungraded_share": 0.0,
        "vote_share_reward/ungraded_share": 0.0,
    }


def test_group_majority_reward_pays_agreement_with_the_group_s_own_majority_not_the_offline_label():
    """TTRL's online reward: problem p's group says 5, 5.0, 3 (its offline label, 3, is outvoted), q's says nothing
    gradable (no majority: 0 for all), and the labeled row g keeps its reward against the gold answer."""
    completions = ["\\boxed{5}", "\\boxed{5.0}", "\\boxed{3}", "no answer", "none either", "\\boxed{8}", "\\boxed{9}"]
    logged = {}
    rewards = group_majority_reward(
        completions,
        ["3", "3", "3", "4", "4", "8", "8"],
        ["p", "p", "p", "q", "q", "g", "g"],
        label_source=["pseudo"] * 5 + ["gold"] * 2,
        log_metric=logged.__setitem__,
    )
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert logged["group_majority_reward/differs_from_offline_label"] == 1.0  # p's majority 5 is not 3; q has none
    assert logged["group_majority_reward/pseudo"] == 0.4 and logged["group_majority_reward/gold"] == 0.5
    with pytest.raises(ValueError, match=r"group_majority needs grpo\.processes 1"):
        StudentSettings(
            reward="group_majority",
            grpo=GRPOSettings(processes=2, prompts_per_step=2, num_generations=2, rollouts=TRL_ROLLOUTS),
        )


def test_the_gated_vote_gives_no_gradient_to_a_group_below_its_share_or_margin():
    """Groups of eight under SCRL's gate (half the votes, a lead of two): p's top answer has half the votes but
    leads by one, r's leads by two with under half; q's passes both. Without the gate each plurality pays."""
    answers = {
        "p": ["5"] * 4 + ["3"] * 3 + ["2"],
        "q": ["7"] * 5 + ["1"] * 2 + [None],
        "r": ["4"] * 3 + ["6"] + ["8"] + ["9"] + ["10"] + ["11"],
    }
    completions = [f"\\boxed{{{answer}}}" if answer else "no answer" for group in answers.values() for answer in group]
    problems = [problem for problem, group in answers.items() for _ in group]
    logged = {}
    gated = group_majority_reward(
        completions,
        ["0"] * len(problems),
        problems,
        label_source=["pseudo"] * len(problems),
        log_metric=logged.__setitem__,
        gate=MajorityGate(min_share=0.5, min_margin=2),
    )
    paid = {problem: [gated[row] for row, p in enumerate(problems) if p == problem] for problem in answers}
    assert paid == {"p": [0.0] * 8, "q": [1.0] * 5 + [0.0] * 3, "r": [0.0] * 8}
    assert logged["group_majority_reward/gated_share"] == pytest.approx(2 / 3)
    plain = group_majority_reward(completions, ["0"] * len(problems), problems, label_source=["pseudo"] * 24)
    assert plain[:8] == [1.0] * 4 + [0.0] * 4 and plain[16:] == [1.0] * 3 + [0.0] * 5
    with pytest.raises(ValueError, match="gate the online vote of reward group_majority"):
        StudentSettings(vote_min_margin=2)


def test_vote_shares_join_the_pseudo_labeled_rows_only():
    shares = pl.DataFrame({"problem_id": ["pseudo-0", "pseudo-1"], "vote_shares": ['[["7", 0.75]]', '[["7", 1.0]]']})
    dataset = build_training_dataset(labeled_frame(2), pseudo_frame(2), SYSTEM_PROMPT, vote_shares=shares)
    assert {row["problem_id"]: row["vote_shares"] for row in dataset} == {
        "gold-0": "[]",
        "gold-1": "[]",
        "pseudo-0": '[["7", 0.75]]',
        "pseudo-1": '[["7", 1.0]]',
    }


def test_the_rollout_engine_s_kv_cache_holds_a_step_s_sequences_in_whole_blocks() -> None:
    from types import SimpleNamespace

    from noisy_student_assets.core.vllm_engine import KV_CACHE_BLOCK_TOKENS, kv_cache_bytes

    smollm2 = SimpleNamespace(num_hidden_layers=30, num_key_value_heads=3, hidden_size=576, num_attention_heads=9)
    per_token_float32 = 2 * 30 * 3 * 64 * 4  # keys and values, every layer's 3 heads of 64

    assert kv_cache_bytes(smollm2, "float32", 16, 300) == 16 * 2 * KV_CACHE_BLOCK_TOKENS * per_token_float32
    assert kv_cache_bytes(smollm2, "bfloat16", 16, 256) == 16 * KV_CACHE_BLOCK_TOKENS * per_token_float32 // 2
    assert kv_cache_bytes(SimpleNamespace(**vars(smollm2), head_dim=32), "float32", 1, 1) == (
        KV_CACHE_BLOCK_TOKENS * per_token_float32 // 2
    )


def test_a_round_s_completion_cap_is_the_teacher_s_p99_length_plus_the_margin_at_most_the_fixed_cap() -> None:
    import polars as pl

    from noisy_student_assets.core.training.grpo import completion_cap

    lengths = pl.Series([11] * 95 + [14, 20, 21, 30, 96])  # the 99th of 100 sorted lengths is 30
    fixed = GRPOSettings(seed=0, max_completion_length=96)
    assert completion_cap(lengths, fixed) == (96, 30.0), "no margin: the fixed cap"
    assert completion_cap(lengths, fixed.model_copy(update={"completion_cap_margin": 8})) == (38, 30.0)
    assert completion_cap(lengths, fixed.model_copy(update={"completion_cap_margin": 80})) == (96, 30.0)


def test_labeled_rl_refuses_a_cap_from_a_teacher_it_does_not_have() -> None:
    from noisy_student_assets.core.settings import LabeledRLSettings

    with pytest.raises(ValueError, match="no teacher samples"):
        LabeledRLSettings(grpo=GRPOSettings(seed=0, completion_cap_margin=8))
