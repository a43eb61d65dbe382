"""The outcome verifier: grading and pairing the teacher's samples, a short real RewardTrainer run on the tiny model
(it learns to rank right samples above wrong ones and saves a merged checkpoint), scoring, AUROC and the check
that scores are usable."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import polars as pl
import pytest

from noisy_student_assets.core.prompts import build_messages
from noisy_student_assets.core.settings import VerifierSettings
from noisy_student_assets.core.training import verifier
from noisy_student_assets.core.training.base import TrainingRun
from noisy_student_assets.core.training.verifier import (
    auroc,
    graded_samples,
    preference_pairs,
    score_failure,
    score_samples,
    train_verifier,
    verifier_messages,
)

# Right and wrong samples differ in wording, and the wrong ones in no number of the problem, so that the tiny random
# model can tell them apart in a few steps: the point is that training works end to end, not that the verifier can add.
RIGHT = (
    "{a} + {b} = {total}. The answer is \\boxed{{{total}}}.",
    "Adding {b} to {a} gives {total}, so \\boxed{{{total}}}.",
)
WRONG = ("Hmm, I guess \\boxed{0}?", "Not sure... maybe \\boxed{100}?")
TINY_VERIFIER = VerifierSettings(
    max_steps=12, pairs_per_step=8, learning_rate=5e-3, max_length=96, lora_r=8, lora_alpha=16
)


def addition_problems(pairs_of_terms: list[tuple[int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "problem_id": [f"add-{a}-{b}" for a, b in pairs_of_terms],
            "prompt": [f"What is {a} + {b}?" for a, b in pairs_of_terms],
            "gold_answer": [str(a + b) for a, b in pairs_of_terms],
        }
    )


def addition_samples(pairs_of_terms: list[tuple[int, int]]) -> pl.DataFrame:
    """Two right and two wrong samples of each problem, as the sampler's table has them."""
    rows = []
    for a, b in pairs_of_terms:
        texts = [text.format(a=a, b=b, total=a + b) for text in RIGHT] + list(WRONG)
        answers = [str(a + b)] * len(RIGHT) + ["0", "100"]
        rows += [
            {"problem_id": f"add-{a}-{b}", "sample_index": index, "completion": text, "answer": answer}
            for index, (text, answer) in enumerate(zip(texts, answers, strict=True))
        ]
    return pl.DataFrame(
        rows, schema={"problem_id": pl.Utf8, "sample_index": pl.Int32, "completion": pl.Utf8, "answer": pl.Utf8}
    )


TRAIN_TERMS = [(a, b) for a in range(1, 5) for b in range(2, 5)]
HELD_OUT_TERMS = [(a, b) for a in range(11, 14) for b in range(21, 23)]


def training_pairs():
    graded = graded_samples(addition_samples(TRAIN_TERMS), addition_problems(TRAIN_TERMS))
    return preference_pairs(graded, max_pairs_per_problem=4, seed=0)


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """A verifier trained `TINY_VERIFIER.max_steps` steps, checkpointed into the `work` dir beside it."""
    root = tmp_path_factory.mktemp("verifier")
    metrics = train_verifier(
        tiny_model_dir, training_pairs(), TINY_VERIFIER, root / "verifier", TrainingRun(root / "work")
    )
    return metrics, root / "verifier"


def held_out_scores(verifier_dir: Path, batch_size: int = 8) -> tuple[list[float], list[bool]]:
    graded = graded_samples(addition_samples(HELD_OUT_TERMS), addition_problems(HELD_OUT_TERMS))
    scores = score_samples(
        verifier_dir, graded["prompt"].to_list(), graded["completion"].to_list(), batch_size=batch_size, max_length=96
    )
    return scores, graded["correct"].to_list()


def test_the_verifier_learns_to_rank_held_out_right_samples_above_wrong_ones(trained) -> None:
    metrics, verifier_dir = trained
    scores, correct = held_out_scores(verifier_dir)
    assert all(math.isfinite(score) for score in scores)
    assert score_failure(scores) is None
    assert auroc(scores, correct) >= 0.9
    assert metrics["steps"] == TINY_VERIFIER.max_steps and metrics["skipped_steps"] == 0
    assert metrics["pairs"] == 4 * len(TRAIN_TERMS)
    assert metrics["train_loss_last_quarter"] < metrics["train_loss_first_quarter"]
    assert 0.0 <= metrics["pair_accuracy_last_quarter"] <= 1.0


def test_the_verifier_is_saved_merged_as_a_sequence_classifier(trained) -> None:
    from safetensors import safe_open
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    _, verifier_dir = trained
    assert not list(verifier_dir.glob("adapter_*"))
    model = AutoModelForSequenceClassification.from_pretrained(verifier_dir)
    assert model.config.num_labels == 1
    assert model.config.pad_token_id == AutoTokenizer.from_pretrained(verifier_dir).pad_token_id
    with safe_open(str(verifier_dir / "model.safetensors"), framework="pt") as weights:
        names = list(weights.keys())
    assert "score.weight" in names
    assert not [name for name in names if "lora_" in name or "modules_to_save" in name]


def test_a_score_does_not_depend_on_its_batch(trained) -> None:
    """Right padding: the head reads each chat's last real token whatever the longest chat of its batch."""
    _, verifier_dir = trained
    batched, _ = held_out_scores(verifier_dir, batch_size=8)
    alone, _ = held_out_scores(verifier_dir, batch_size=1)
    assert batched == pytest.approx(alone, abs=1e-4)


def test_training_resumes_from_its_latest_checkpoint_head_included(
    trained, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The scalar head is restored with the adapters: a fresh random head would rank at chance after one more step."""
    _, verifier_dir = trained
    shutil.copytree(verifier_dir.parent / "work", tmp_path / "work")
    more_steps = TINY_VERIFIER.model_copy(update=dict(max_steps=TINY_VERIFIER.max_steps + 1))
    metrics = train_verifier(
        tiny_model_dir, training_pairs(), more_steps, tmp_path / "verifier", TrainingRun(tmp_path / "work")
    )
    assert metrics["resumed_from_step"] == TINY_VERIFIER.max_steps and metrics["steps"] == TINY_VERIFIER.max_steps + 1
    scores, correct = held_out_scores(tmp_path / "verifier")
    assert auroc(scores, correct) >= 0.9
    right = [score for score, ok in zip(scores, correct, strict=True) if ok]
    wrong = [score for score, ok in zip(scores, correct, strict=True) if not ok]
    assert sum(right) / len(right) - sum(wrong) / len(wrong) > 1.0


def test_a_checkpoint_that_is_not_a_verifier_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="is not a verifier"):
        score_samples(tiny_model_dir, ["What is 1 + 1?"], ["2"], batch_size=1, max_length=32)


# --- grading and pairs -----------------------------------------------------------------------------------


def graded_frame(samples: dict[str, list[bool]]) -> pl.DataFrame:
    """`graded_samples`' table: each problem's samples, right or wrong, their text saying which."""
    return pl.DataFrame(
        [
            {
                "problem_id": pid,
                "sample_index": index,
                "prompt": f"Problem {pid}",
                "completion": f"{pid} sample {index} {'right' if right else 'wrong'}",
                "answer": "1" if right else "2",
                "correct": right,
            }
            for pid, verdicts in samples.items()
            for index, right in enumerate(verdicts)
        ],
        schema_overrides={"sample_index": pl.Int32},
    )


def answer_of(messages: list[dict[str, str]]) -> str:
    return messages[-1]["content"]


def test_pairs_come_only_from_problems_with_right_and_wrong_samples() -> None:
    graded = graded_frame(
        {"mixed": [True, False, True, False, False], "all-right": [True, True], "all-wrong": [False, False]}
    )
    pairs = preference_pairs(graded, max_pairs_per_problem=10, seed=0)
    assert set(pairs["problem_id"]) == {"mixed"}
    assert len(pairs) == 2 * 3
    assert {(answer_of(row["chosen"]), answer_of(row["rejected"])) for row in pairs} == {
        (f"mixed sample {right} right", f"mixed sample {wrong} wrong") for right in (0, 2) for wrong in (1, 3, 4)
    }
    row = pairs[0]
    assert row["chosen"][:-1] == row["rejected"][:-1] == build_messages("Problem mixed")
    assert row["chosen"][-1]["role"] == "assistant"


def test_pairs_are_capped_per_problem_and_seeded() -> None:
    graded = graded_frame({"a": [True, True, False, False, False], "b": [False, True]})
    pairs = preference_pairs(graded, max_pairs_per_problem=4, seed=0)
    assert pairs["problem_id"].count("a") == 4 and pairs["problem_id"].count("b") == 1
    assert len({(answer_of(row["chosen"]), answer_of(row["rejected"])) for row in pairs}) == 5

    def drawn(seed: int) -> list:
        return [(answer_of(row["chosen"]), answer_of(row["rejected"])) for row in preference_pairs(graded, 4, seed)]

    assert drawn(0) == drawn(0)
    assert len({tuple(drawn(seed)) for seed in range(6)}) > 1


def test_no_pairs_say_why_and_what_to_change() -> None:
    graded = graded_frame({"all-right": [True, True], "all-wrong": [False]})
    with pytest.raises(
        ValueError,
        match=(
            r"no labeled problem has both a right and a wrong.*1 problems have only right.*1 only wrong"
            r".*higher temperature"
        ),
    ):
        preference_pairs(graded, max_pairs_per_problem=4, seed=0)


def test_grading_leaves_ungraded_samples_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        verifier, "answers_equivalent", lambda gold, answer: None if answer == "slow" else gold == answer
    )
    problems = pl.DataFrame(
        {"problem_id": ["p"], "prompt": ["What is 1 + 2?"], "gold_answer": ["3"], "source": ["file"]}
    )
    generations = pl.DataFrame(
        {
            "problem_id": ["p"] * 4,
            "sample_index": [0, 1, 2, 3],
            "completion": ["\\boxed{3}", "\\boxed{4}", "slow", "none"],
            "answer": ["3", "4", "slow", None],
        },
        schema_overrides={"sample_index": pl.Int32},
    )
    graded = graded_samples(generations, problems)
    assert graded.columns == ["problem_id", "sample_index", "prompt", "completion", "answer", "correct"]
    assert graded.select("sample_index", "correct").rows() == [(0, True), (1, False), (3, False)]
    pairs = preference_pairs(graded, max_pairs_per_problem=10, seed=0)
    assert sorted(answer_of(row["rejected"]) for row in pairs) == ["\\boxed{4}", "none"]


def test_grading_refuses_samples_of_unknown_problems() -> None:
    problems = pl.DataFrame({"problem_id": ["p"], "prompt": ["What is 1 + 2?"], "gold_answer": ["3"]})
    generations = pl.DataFrame({"problem_id": ["q"], "sample_index": [0], "completion": ["3"], "answer": ["3"]})
    with pytest.raises(ValueError, match=r"missing from the problem table.*'q'"):
        graded_samples(generations, problems)


def test_verifier_messages_are_the_problem_as_every_stage_asks_it_then_the_sample() -> None:
    assert verifier_messages("What is 1 + 2?", "3") == [
        *build_messages("What is 1 + 2?"),
        {"role": "assistant", "content": "3"},
    ]


# --- AUROC and usable scores -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scores", "labels", "expected"),
    [
        ([0.1, 0.2, 0.8, 0.9], [False, False, True, True], 1.0),
        ([0.1, 0.2, 0.8, 0.9], [True, True, False, False], 0.0),
        ([0.5, 0.5, 0.5, 0.5], [True, False, True, False], 0.5),
        ([0.1, 0.4, 0.35, 0.8], [False, False, True, True], 0.75),
        ([1.0, 1.0, 0.0], [True, False, False], 0.75),  # the tie with a wrong sample counts half
        ([0.3, 0.7], [True, True], None),
        ([0.3, 0.7], [False, False], None),
    ],
)
def test_auroc(scores: list[float], labels: list[bool], expected: float | None) -> None:
    assert auroc(scores, labels) == (pytest.approx(expected) if expected is not None else None)


def test_auroc_refuses_scores_it_cannot_rank() -> None:
    with pytest.raises(ValueError, match="finite"):
        auroc([math.nan, 0.2], [True, False])
    with pytest.raises(ValueError, match="2 scores but 3 labels"):
        auroc([0.1, 0.2], [True, False, True])


@pytest.mark.parametrize(
    ("scores", "reason"),
    [
        ([0.1, math.nan, 0.3], "1 of 3 verifier scores are NaN or infinite"),
        ([0.1, math.inf, -math.inf], "2 of 3 verifier scores are NaN or infinite"),
        ([0.25, 0.25 + 1e-7, 0.25], "all 3 verifier scores are 0.25"),
        ([], "no samples"),
    ],
)
def test_unusable_scores_say_why(scores: list[float], reason: str) -> None:
    failure = score_failure(scores)
    assert failure is not None and reason in failure


def test_scores_that_rank_samples_are_usable() -> None:
    assert score_failure([-1.5, 0.0, 2.25]) is None
