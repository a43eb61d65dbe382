"""Majority voting by mathematical equivalence, with the real math-verify."""

import math

import pytest

from noisy_student_assets.core.pseudo_labels.consensus import Vote, majority_vote


def test_required_example():
    vote = majority_vote(["1/2", "0.5", "\\frac{1}{2}", "2", None])
    assert (vote.answer, vote.count, vote.agreement, vote.n_clusters, vote.k) == ("1/2", 3, 0.6, 2, 5)
    assert vote.entropy == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))


def test_equivalent_forms_outvote_a_more_frequent_exact_string():
    vote = majority_vote(["0.5", "3", "1/2", "3", "\\frac{1}{2}"])
    assert (vote.answer, vote.count, vote.n_clusters) == ("0.5", 3, 2)


def test_representative_is_the_most_frequent_exact_string():
    vote = majority_vote(["\\frac{1}{2}", "1/2", "0.5", "1/2"])
    assert (vote.answer, vote.count, vote.n_clusters, vote.entropy) == ("1/2", 4, 1, 0.0)


def test_whitespace_is_not_a_difference():
    assert majority_vote([" 4", "4 ", "4"]).count == 3


@pytest.mark.parametrize(
    ("answers", "winner"),
    [
        (["3", "2", "2", "3"], "3"),
        (["2", "3", "3", "2"], "2"),
        (["7", "1/2", "7", "0.5"], "7"),
        (["1/2", "7", "0.5", "7"], "1/2"),
        ([None, "9", "8"], "9"),
    ],
)
def test_ties_go_to_the_earliest_first_occurrence(answers, winner):
    assert majority_vote(answers).answer == winner


@pytest.mark.parametrize("answers", [[None, None, ""], [" ", None], []])
def test_no_answers_no_winner(answers):
    assert majority_vote(answers) == Vote(
        answer=None, count=0, agreement=0.0, n_clusters=0, entropy=0.0, k=len(answers)
    )


@pytest.mark.parametrize(
    "missing", [None, "", "1" * 2000, "{" * 100 + "4" + "}" * 100, "2 + 2"]
)  # a restated question too
def test_missing_or_ungradable_answers_never_win(missing):
    vote = majority_vote([missing, missing, missing, "4"])
    assert (vote.answer, vote.count, vote.agreement, vote.n_clusters, vote.entropy) == ("4", 1, 0.25, 1, 0.0)


@pytest.mark.parametrize(
    ("answers", "entropy"),
    [
        (["5", "5.0", "5"], 0.0),
        (["1", "2", None, None], math.log(2)),
        (["1", "1", "2", "3"], -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))),
        (["1", "2", "3", "4"], math.log(4)),
    ],
)
def test_entropy_in_nats_over_gradable_answers(answers, entropy):
    assert majority_vote(answers).entropy == pytest.approx(entropy)


def test_votes_are_deterministic():
    answers = ["0.5", "2", "1/2", "2", None, "\\frac{2}{4}", "x", "2.0"]
    votes = {majority_vote(answers) for _ in range(5)}
    assert len(votes) == 1
    # Clusters {2, 2.0} and {0.5, 1/2, 2/4} tie at 3; "0.5" occurs first.
    shares = (3 / 7, 3 / 7, 1 / 7)
    entropy = pytest.approx(-sum(p * math.log(p) for p in shares))
    assert votes.pop() == Vote(answer="0.5", count=3, agreement=3 / 8, n_clusters=3, entropy=entropy, k=8, runner_up=3)


@pytest.mark.parametrize(
    ("answers", "count", "runner_up"),
    [(["4", "4.0", "4", "7", "7", "1"], 3, 2), (["4", "4"], 2, 0), ([None, "2", "3"], 1, 1)],
)
def test_the_runner_up_is_the_second_cluster_s_size(answers, count, runner_up):
    vote = majority_vote(answers)
    assert (vote.count, vote.runner_up) == (count, runner_up)


def test_each_problem_s_vote_is_its_own():
    answer_lists = [["1", "1", "2"], [None], ["0.5", "1/2"]]
    assert [majority_vote(answers).answer for answers in answer_lists] == ["1", None, "0.5"]


def test_ungraded_answers_join_no_cluster_and_are_counted(ungraded_pair):
    founder, slow_to_compare = ungraded_pair
    vote = majority_vote([founder, founder, slow_to_compare, "9^{9^{9^{9}}}", "x"])  # the tower: ungraded alone
    assert (vote.answer, vote.count, vote.agreement, vote.n_clusters, vote.ungraded, vote.k) == (
        founder,
        2,
        0.4,
        2,
        2,
        5,
    )
