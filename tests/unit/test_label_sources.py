"""Label sources: weighted votes, each registered source's weights, the label-quality frontier and the flips; and the
hidden gold reaching none of them."""

import math
from dataclasses import replace

import polars as pl
import pytest

from noisy_student_assets.core.pseudo_labels.consensus import majority_vote, weighted_vote
from noisy_student_assets.core.pseudo_labels.frontier import ORACLE, at_coverages, oracle_curve, source_curve
from noisy_student_assets.core.pseudo_labels.labels import pseudo_label, vote_pseudo_labels
from noisy_student_assets.core.pseudo_labels.sources.registry import SOURCES, label_source
from noisy_student_assets.core.reporting.test_time import flips
from noisy_student_assets.core.settings import PseudoLabelSettings
from noisy_student_assets.core.training.modes.registry import accepted

# --- weighted votes ---------------------------------------------------------------------------------------------


def test_weights_change_the_winner_where_they_must():
    answers = ["3", "3", "3", "1/2", "0.5"]
    assert majority_vote(answers).answer == "3"
    vote = weighted_vote(answers, [0.1, 0.1, 0.1, 0.9, 0.8])
    assert (vote.answer, vote.count, vote.n_clusters, vote.k) == ("1/2", 2, 2, 5)
    assert vote.agreement == pytest.approx(1.7 / 2.0)


def test_unit_weights_are_the_head_count_to_the_last_digit():
    for answers in (
        ["1/2", "0.5", "\\frac{1}{2}", "2", None],
        ["2", "3", "3", "2"],
        [None, None],
        ["7", "1/2", "7", "0.5"],
    ):
        assert weighted_vote(answers, [1.0] * len(answers)) == majority_vote(answers)


def test_weight_ties_go_to_the_larger_cluster_then_the_earliest():
    assert weighted_vote(["1", "2", "2"], [1.0, 0.5, 0.5]).answer == "2"  # equal weight: two samples beat one
    assert weighted_vote(["1", "2"], [0.5, 0.5]).answer == "1"  # equal weight and size: the first seen


def test_zero_weights_never_win_and_all_zero_is_no_label():
    vote = weighted_vote(["5", "5", "6"], [0.0, 0.0, 0.2])
    assert (vote.answer, vote.agreement, vote.n_clusters) == ("6", 1.0, 1)
    assert weighted_vote(["5", "6"], [0.0, 0.0]).answer is None


def test_missing_answers_weigh_against_agreement():
    assert weighted_vote(["5", None], [1.0, 3.0]).agreement == pytest.approx(0.25)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -0.1])
def test_a_non_finite_or_negative_weight_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="finite and >= 0"):
        weighted_vote(["1", "2"], [1.0, bad])


def test_weights_must_match_the_answers():
    with pytest.raises(ValueError, match="2 weights for 3 answers"):
        weighted_vote(["1", "2", "3"], [1.0, 1.0])


# --- sources ----------------------------------------------------------------------------------------------------

PROBLEMS = pl.DataFrame({"problem_id": ["a", "b"], "prompt": ["pa", "pb"], "hidden_gold_answer": ["7", "4"]})
GENERATIONS = pl.DataFrame(
    {
        "problem_id": ["a"] * 4 + ["b"] * 4,
        "sample_index": [0, 1, 2, 3] * 2,
        "answer": ["5", "5", "7", "7", "4", "4", "4", "9"],
        # a's 7s are the confident ones; b's 9 is the most confident sample, yet alone
        "mean_logprob": [-2.0, -2.0, -0.1, -0.2, -1.0, -1.0, -1.5, -0.05],
    },
    schema_overrides={"sample_index": pl.Int32},
)
SCORES = pl.DataFrame(
    {
        "problem_id": ["a"] * 4 + ["b"] * 4,
        "sample_index": [0, 1, 2, 3] * 2,
        "score": [-3.0, -3.0, 2.0, 2.0, 1.0, 1.0, 1.0, -1.0],
    },
    schema_overrides={"sample_index": pl.Int32},
)


def labels_of(source: str, scores=None, **settings) -> pl.DataFrame:
    chosen = PseudoLabelSettings(label_source=source, tau=0.5, **settings)
    return vote_pseudo_labels(label_source(source).weighted(GENERATIONS, chosen, scores), PROBLEMS, chosen.tau)


def test_majority_ties_where_confidence_and_verifier_decide():
    assert labels_of("majority")["pseudo_label"].to_list() == ["5", "4"]  # a: 2-2 tie, the first seen
    assert labels_of("confidence")["pseudo_label"].to_list() == ["7", "4"]
    assert labels_of("verifier", SCORES)["pseudo_label"].to_list() == ["7", "4"]


def test_confidence_weight_is_the_geometric_mean_token_probability():
    weighted = label_source("confidence").weighted(GENERATIONS, PseudoLabelSettings(label_source="confidence"))
    assert weighted["weight"].to_list() == pytest.approx([math.exp(lp) for lp in GENERATIONS["mean_logprob"]])


def test_confidence_drops_the_least_confident_share_of_each_problem():
    weighted = label_source("confidence").weighted(
        GENERATIONS, PseudoLabelSettings(label_source="confidence", drop_least_confident=0.5)
    )
    dropped = weighted.filter(pl.col("weight") == 0)
    assert sorted(dropped.select("problem_id", "sample_index").iter_rows()) == [("a", 0), ("a", 1), ("b", 1), ("b", 2)]
    # b keeps one 4 (at -1.0, the earlier of the tie dropped last) and the 9: the 9 is more confident
    assert labels_of("confidence", drop_least_confident=0.5)["pseudo_label"].to_list() == ["7", "9"]


def test_sources_without_their_input_say_what_is_missing():
    with pytest.raises(ValueError, match="verifier scores, and there are none"):
        labels_of("verifier")
    with pytest.raises(ValueError, match="log-probabilities"):
        label_source("confidence").weighted(GENERATIONS.drop("mean_logprob"), PseudoLabelSettings())
    with pytest.raises(ValueError, match="scored 7 of the round's 8"):
        labels_of("verifier", SCORES.head(7))
    with pytest.raises(ValueError, match="non-finite"):
        labels_of(
            "verifier",
            SCORES.with_columns(pl.when(pl.col("sample_index") == 0).then(math.nan).otherwise("score").alias("score")),
        )


def test_an_unregistered_source_is_refused_where_settings_enter():
    with pytest.raises(ValueError, match="label source 'oracle' is not one of"):
        accepted(PseudoLabelSettings(label_source="oracle"))
    assert set(SOURCES) == {"majority", "confidence", "verifier"}


def gold_leaks(label) -> list[str]:
    """The sources whose labels change when the unlabeled problems' hidden gold is poisoned (`label`: the stage)."""
    poisoned = PROBLEMS.with_columns(pl.lit("987654321").alias("hidden_gold_answer"))
    leaking = []
    for source in SOURCES:
        settings = PseudoLabelSettings(label_source=source, tau=0.6)
        clean, dirty = label(GENERATIONS, PROBLEMS, settings, SCORES), label(GENERATIONS, poisoned, settings, SCORES)
        # Some kept label is right under the true gold and none under the poison: a filter by gold would show.
        assert clean.stats["kept_label_accuracy"] > 0 and dirty.stats["kept_label_accuracy"] == 0, source
        if not clean.labels.equals(dirty.labels):
            leaking.append(source)
    return leaking


def test_the_hidden_gold_reaches_no_source():
    """Poisoning the gold changes no label of any source (the audit alone reads it)."""
    assert gold_leaks(pseudo_label) == []


def test_a_leak_that_filters_labels_by_gold_is_caught():
    def filtering_by_gold(generations, unlabeled, settings, scores):
        result = pseudo_label(generations, unlabeled, settings, scores)
        gold = dict(unlabeled.select("problem_id", "hidden_gold_answer").iter_rows())
        kept = pl.col("kept") & pl.col("problem_id").replace_strict(gold).eq(pl.col("pseudo_label"))
        return replace(result, labels=result.labels.with_columns(kept.alias("kept")))

    assert gold_leaks(filtering_by_gold) == list(SOURCES)


# --- frontier ---------------------------------------------------------------------------------------------------


def voted(agreements: list[float | None], correct: list[bool | None]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "pseudo_label": ["x" if a is not None else None for a in agreements],
            "agreement": [a or 0.0 for a in agreements],
            "label_correct": correct,
        }
    )


def test_frontier_keeps_the_most_confident_first_and_averages_within_ties():
    curve = source_curve("s", voted([1.0, 0.5, 0.5, None], [True, True, False, None]))
    assert curve["kept"].to_list() == [1, 2, 3]
    assert curve["coverage"].to_list() == pytest.approx([0.25, 0.5, 0.75])
    # the tie at 0.5 holds one right label of two: half a right label expected per problem taken from it
    assert curve["label_accuracy"].to_list() == pytest.approx([1.0, 1.5 / 2, 2 / 3])


def test_ungraded_labels_count_as_not_right():
    assert source_curve("s", voted([1.0], [None]))["label_accuracy"].to_list() == [0.0]


def test_oracle_is_right_wherever_a_sample_is():
    curve = oracle_curve(problems=4, solved=2)
    assert curve["label_accuracy"].to_list() == pytest.approx([1.0, 1.0, 2 / 3, 0.5])
    assert set(curve["source"]) == {ORACLE}


def test_sources_compared_at_matched_coverage():
    curve = pl.concat([source_curve("s", voted([1.0, 0.5, 0.5, None], [True, True, False, None])), oracle_curve(4, 2)])
    matched = at_coverages(curve, 4, coverages=(0.25, 0.5, 1.0))
    rows = {row["source"]: row for row in matched.iter_rows(named=True)}
    assert rows["s"]["at 25%"] == 1.0 and rows["s"]["at 50%"] == pytest.approx(0.75) and rows["s"]["at 100%"] is None
    assert rows[ORACLE]["at 100%"] == 0.5


def test_pseudo_label_reports_every_source_it_can_and_the_oracle():
    result = pseudo_label(GENERATIONS, PROBLEMS, PseudoLabelSettings(tau=0.5), SCORES)
    assert set(result.frontier["source"]) == {"majority", "confidence", "verifier", ORACLE}
    operating = {row["source"]: row for row in result.sources.iter_rows(named=True)}
    assert (
        operating["verifier"]["at tau: label_accuracy"] == 1.0
        and operating["majority"]["at tau: label_accuracy"] == 0.5
    )
    without = pseudo_label(GENERATIONS.drop("mean_logprob"), PROBLEMS, PseudoLabelSettings(tau=0.5))
    assert set(without.frontier["source"]) == {"majority", ORACLE}


# --- flips ------------------------------------------------------------------------------------------------------


def test_flips_count_both_ways_and_add_up_to_the_difference():
    teacher = pl.DataFrame({"problem_id": list("abcde"), "greedy_correct": [True, True, False, False, None]})
    student = pl.DataFrame({"problem_id": list("abcde"), "greedy_correct": [True, False, True, True, True]})
    sets = pl.DataFrame({"problem_id": list("abc"), "eval_set": ["transductive", "transductive", "transfer"]})
    table = {row["eval_set"]: row for row in flips(teacher, student, sets).iter_rows(named=True)}
    assert (table["all"]["problems"], table["all"]["right_to_wrong"], table["all"]["wrong_to_right"]) == (4, 1, 2)
    assert table["all"]["difference"] == pytest.approx(0.25)
    assert (table["transductive"]["right_to_wrong"], table["transductive"]["wrong_to_right"]) == (1, 0)
    assert (table["transfer"]["right_to_wrong"], table["transfer"]["wrong_to_right"]) == (0, 1)
    assert list(flips(teacher, student)["eval_set"]) == ["all"]
