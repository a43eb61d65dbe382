"""The student's training data in each mode (SFT rows, DPO pairs, vote shares, the agreement band), built
from hand-made votes through the real majority vote."""

from __future__ import annotations

import json

import polars as pl
import pytest

from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN
from noisy_student_assets.core.pseudo_labels.labels import vote_pseudo_labels
from noisy_student_assets.core.pseudo_labels.student_data import (
    DPO_PAIR_SCHEMA,
    SFT_ROW_SCHEMA,
    dpo_pairs,
    in_agreement_band,
    sft_rows,
    vote_share_of,
    vote_share_table,
)


def completion(problem_id: str, index: int, answer: str | None) -> str:
    return f"{problem_id} sample {index}: " + (f"so \\boxed{{{answer}}}" if answer is not None else "I cannot tell")


def votes(
    answers_by_problem: dict[str, list[str | None]], tau: float = 0.5
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Generations, the unlabeled problems (hidden gold "7" everywhere) and their pseudo-labels at `tau`."""
    generations = pl.DataFrame(
        [
            {"problem_id": pid, "sample_index": i, "completion": completion(pid, i, answer), "answer": answer}
            for pid, answers in answers_by_problem.items()
            for i, answer in enumerate(answers)
        ],
        schema={"problem_id": pl.Utf8, "sample_index": pl.Int32, "completion": pl.Utf8, "answer": pl.Utf8},
    )
    problems = pl.DataFrame(
        {
            "problem_id": list(answers_by_problem),
            "prompt": [f"Problem {pid}?" for pid in answers_by_problem],
            HIDDEN_GOLD_COLUMN: "7",
        }
    )
    return generations, problems, vote_pseudo_labels(generations, problems, tau)


def completions_of(frame: pl.DataFrame, column: str = "completion") -> list[str]:
    return frame[column].to_list()


# --- SFT rows -------------------------------------------------------------------------------------


def test_sft_rows_are_the_samples_agreeing_with_the_label_repeated_to_fill_the_group() -> None:
    generations, _, labels = votes({"p": ["3", "4", "3", "0.5", "3"]})
    rows = sft_rows(generations, labels, group_size=5)
    assert rows.schema == SFT_ROW_SCHEMA
    agreeing = [completion("p", i, "3") for i in (0, 2, 4)]
    assert completions_of(rows) == [*agreeing, *agreeing[:2]]
    assert set(rows["prompt"]) == {"Problem p?"}


def test_sft_rows_count_equivalent_answers_as_agreeing() -> None:
    generations, _, labels = votes({"p": ["1/2", "0.5", "2", "\\frac{1}{2}"]})
    assert len(set(completions_of(sft_rows(generations, labels, group_size=3)))) == 3


def test_sft_rows_cap_the_distinct_samples_per_problem() -> None:
    generations, _, labels = votes({"p": ["3", "3", "3", "3"]})
    rows = sft_rows(generations, labels, group_size=4, distinct_per_problem=2)
    assert completions_of(rows) == [completion("p", i, "3") for i in (0, 1, 0, 1)]


def test_a_tie_trains_on_the_vote_s_winner_only() -> None:
    generations, _, labels = votes({"p": ["4", "3", "3", "4"]})
    assert labels["pseudo_label"].to_list() == ["4"]  # a tie goes to the earliest answer
    assert completions_of(sft_rows(generations, labels, group_size=2)) == [
        completion("p", 0, "4"),
        completion("p", 3, "4"),
    ]


def test_problems_without_a_kept_label_give_no_rows() -> None:
    generations, _, labels = votes(
        {"unanswered": [None, None, None, None], "split": ["1", "2", "3", "4"], "kept": ["5", "5", "6", "5"]}
    )
    assert labels["kept"].to_list() == [False, False, True]
    for frame in (sft_rows(generations, labels, group_size=2), dpo_pairs(generations, labels, pairs_per_problem=2)):
        assert set(frame["problem_id"]) == {"kept"}


# --- DPO pairs ------------------------------------------------------------------------------------


def test_dpo_pairs_prefer_agreeing_samples_over_the_least_voted_dissent_first() -> None:
    generations, _, labels = votes({"p": ["1", "2", "1", "3", "2", None, "1", "1"]})
    pairs = dpo_pairs(generations, labels, pairs_per_problem=5)
    assert pairs.schema == DPO_PAIR_SCHEMA
    chosen = [completion("p", i, "1") for i in (0, 2, 6, 7)]
    rejected = [completion("p", 3, "3"), completion("p", 1, "2"), completion("p", 4, "2"), completion("p", 5, None)]
    assert completions_of(pairs, "chosen") == [*chosen, chosen[0]]
    assert completions_of(pairs, "rejected") == [*rejected, rejected[0]]


def test_no_dissent_gives_no_pair() -> None:
    generations, _, labels = votes({"unanimous": ["5", "5", "5", "5"], "dissent": ["6", "6", "6", "9"]})
    pairs = dpo_pairs(generations, labels, pairs_per_problem=2)
    assert pairs["problem_id"].to_list() == ["dissent", "dissent"]
    assert set(completions_of(pairs, "rejected")) == {completion("dissent", 3, "9")}


def test_a_tie_prefers_the_winner_over_the_other_half() -> None:
    generations, _, labels = votes({"p": ["4", "3", "3", "4"]})
    pairs = dpo_pairs(generations, labels, pairs_per_problem=2)
    assert completions_of(pairs, "chosen") == [completion("p", 0, "4"), completion("p", 3, "4")]
    assert completions_of(pairs, "rejected") == [completion("p", 1, "3"), completion("p", 2, "3")]


# --- no answer key --------------------------------------------------------------------------------


def test_a_wrong_majority_trains_exactly_like_a_right_one() -> None:
    """All wrong: the hidden gold is 7 and the vote says 8. The builders cannot tell, so they prefer the 8s."""
    generations, problems, labels = votes({"p": ["8", "9", "8", "8"]})
    assert problems[HIDDEN_GOLD_COLUMN].to_list() == ["7"] and labels["pseudo_label"].to_list() == ["8"]
    eights = [completion("p", i, "8") for i in (0, 2, 3)]
    assert completions_of(sft_rows(generations, labels, group_size=3)) == eights
    pairs = dpo_pairs(generations, labels, pairs_per_problem=2)
    assert completions_of(pairs, "chosen") == eights[:2]
    assert completions_of(pairs, "rejected") == [completion("p", 1, "9")] * 2


@pytest.mark.parametrize("builder", ["sft", "dpo", "vote_shares"])
def test_no_builder_can_read_the_hidden_gold(builder: str) -> None:
    generations, problems, labels = votes({"p": ["8", "8", "8", "9"], "q": ["2", "2", "5", "2"]})

    def build(generations: pl.DataFrame, labels: pl.DataFrame) -> pl.DataFrame:
        if builder == "sft":
            return sft_rows(generations, labels, 4)
        if builder == "dpo":
            return dpo_pairs(generations, labels, 2)
        return vote_share_table(generations, labels)

    clean = build(generations, labels)
    for gold in ("8", "9", None):  # the hidden gold carried along, right, wrong or missing, changes nothing
        poisoned_labels = labels.join(
            problems.with_columns(pl.lit(gold).alias(HIDDEN_GOLD_COLUMN)).select("problem_id", HIDDEN_GOLD_COLUMN),
            on="problem_id",
        )
        poisoned_generations = generations.with_columns(
            pl.lit(gold).alias(HIDDEN_GOLD_COLUMN), pl.lit(gold).alias("gold_answer")
        )
        assert build(poisoned_generations, poisoned_labels).equals(clean)


# --- vote shares and the agreement band -----------------------------------------------------------


def test_vote_shares_give_each_answer_cluster_its_share_of_all_k_votes() -> None:
    generations, _, labels = votes({"p": ["3", "3.0", "4", None]})
    (row,) = vote_share_table(generations, labels).iter_rows(named=True)
    shares = json.loads(row["vote_shares"])
    assert shares == [["3", 0.5], ["4", 0.25]]  # the missing answer counts in k, in no cluster
    assert vote_share_of("3.00", shares) == 0.5
    assert vote_share_of("4", shares) == 0.25
    assert vote_share_of("5", shares) == vote_share_of(None, shares) == 0.0


def test_an_ungraded_sample_is_in_no_pair_and_has_no_vote_share(ungraded_pair) -> None:
    label, slow_to_compare = ungraded_pair
    generations, _, labels = votes({"p": [label, label, label, slow_to_compare, "x"]})
    assert labels["ungraded"].to_list() == [1]
    pairs = dpo_pairs(generations, labels, pairs_per_problem=2)
    assert completions_of(pairs, "rejected") == [completion("p", 4, "x")] * 2  # never the ungraded sample
    assert vote_share_of(slow_to_compare, [[label, 0.6], ["x", 0.2]]) is None


def test_the_agreement_band_keeps_its_closed_interval() -> None:
    labels = pl.DataFrame({"problem_id": ["a", "b", "c", "d"], "agreement": [0.25, 0.5, 0.75, 1.0]})
    assert in_agreement_band(labels, 0.5, 0.75)["problem_id"].to_list() == ["b", "c"]
    assert in_agreement_band(labels, 0.0, 1.0).height == 4
    with pytest.raises(ValueError, match="agreement band"):
        in_agreement_band(labels, 0.8, 0.2)
