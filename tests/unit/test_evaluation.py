"""Eval metrics from greedy and sampled generations (no model: the tables are written by hand)."""

from math import comb

import polars as pl
import pytest

from noisy_student_assets.core.evaluation import breakdown, pass_at_k, score_problems, summarize
from noisy_student_assets.core.settings import EvalSettings

EVAL = pl.DataFrame(
    {
        "problem_id": ["p1", "p2"],
        "prompt": ["1+1", "2+2"],
        "gold_answer": ["2", "4"],
        "source": ["t", "t"],
        "subject": ["add", "add"],
        "level": [1, 2],
    }
)
GREEDY = pl.DataFrame(
    {
        "problem_id": ["p1", "p2"],
        "sample_index": [0, 0],
        "completion": ["so \\boxed{2}", "it is 2 + 2"],
        "answer": ["2", "2 + 2"],  # restating the question is not answering it
        "n_tokens": [10, 20],
    }
)
SAMPLED = pl.DataFrame(
    {
        "problem_id": ["p1"] * 4 + ["p2"] * 4,
        "sample_index": [0, 1, 2, 3] * 2,
        "answer": ["2", "3", "2.0", None, "5", "4", "5", "1"],
    }
)


@pytest.mark.parametrize(("n", "c", "k"), [(8, 0, 1), (8, 1, 1), (8, 3, 4), (8, 8, 8), (10, 2, 5), (4, 1, 2)])
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_k_needs_k_samples() -> None:
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k(4, 1, 5)


def test_scores_and_summary() -> None:
    scores = score_problems(EVAL, GREEDY, SAMPLED, ks=(1, 4))
    p1, p2 = scores.iter_rows(named=True)
    assert (p1["greedy_correct"], p1["greedy_formatted"], p1["samples_correct"]) == (True, True, 2)
    assert (p2["greedy_correct"], p2["greedy_formatted"], p2["samples_correct"]) == (False, False, 1)
    assert (p1["maj@4_correct"], p2["maj@4_correct"]) == (True, False)  # p2 votes "5" twice
    assert (p1["maj@1_correct"], p2["maj@1_correct"]) == (True, False)
    assert (p1["greedy_unevaluated"], p2["greedy_unevaluated"]) == (False, True)
    metrics = summarize(scores, ks=(1, 4))
    assert metrics["greedy_accuracy"] == 0.5 and metrics["format_rate"] == 0.5 and metrics["unevaluated_rate"] == 0.5
    assert metrics["mean_completion_tokens"] == 15
    assert metrics["pass@1"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert metrics["pass@4"] == 1.0 and metrics["maj@4"] == 0.5


def test_breakdown_by_subject_and_level() -> None:
    table = breakdown(score_problems(EVAL, GREEDY, SAMPLED, ks=(1,)))
    rows = {(r["by"], r["value"]): (r["problems"], r["greedy_accuracy"]) for r in table.iter_rows(named=True)}
    assert rows == {("subject", "add"): (2, 0.5), ("level", "1"): (1, 1.0), ("level", "2"): (1, 0.0)}


def test_settings_reject_k_above_samples() -> None:
    with pytest.raises(ValueError, match=r"within 1\.\.samples=4"):
        EvalSettings(samples=4, ks=[1, 8])


def test_greedy_only_scores_without_samples() -> None:
    EvalSettings(samples=0, ks=[])
    with pytest.raises(ValueError, match=r"within 1\.\.samples=0"):
        EvalSettings(samples=0, ks=[1])
    scores = score_problems(EVAL, GREEDY, SAMPLED.clear(), ks=())
    assert scores["samples"].to_list() == [0, 0]
    metrics = summarize(scores, ks=())
    assert metrics["greedy_accuracy"] == 0.5
    assert not [name for name in metrics if name.startswith(("maj@", "pass@"))]


def test_ungraded_checks_are_counted_and_left_out_of_each_metric(ungraded_pair) -> None:
    gold, slow_to_compare = ungraded_pair
    problem = EVAL.head(1).with_columns(pl.lit("p3").alias("problem_id"), pl.lit(gold).alias("gold_answer"))
    greedy = GREEDY.head(1).with_columns(pl.lit("p3").alias("problem_id"), pl.lit(slow_to_compare).alias("answer"))
    sampled = pl.DataFrame(
        {
            "problem_id": ["p3"] * 4,
            "sample_index": [0, 1, 2, 3],
            "answer": [slow_to_compare, gold, slow_to_compare, "x"],
        }
    )
    scores = score_problems(
        pl.concat([EVAL, problem]), pl.concat([GREEDY, greedy]), pl.concat([SAMPLED, sampled]), ks=(1, 4)
    )
    p3 = scores.row(2, named=True)
    assert (
        p3["greedy_correct"],
        p3["samples_correct"],
        p3["samples_ungraded"],
        p3["maj@1_correct"],
        p3["maj@4_correct"],
    ) == (None, 1, 2, None, None)
    metrics = summarize(scores, ks=(1, 4))
    assert metrics["ungraded"] == 5  # greedy, two samples, and maj@1 and maj@4 (both won by the slow answer)
    assert metrics["greedy_accuracy"] == 0.5 and metrics["maj@4"] == 0.5  # over p1 and p2, as without p3
    assert metrics["pass@1"] == pytest.approx((2 / 4 + 1 / 4 + 1 / 2) / 3)  # p3: 1 right of 2 graded samples
    assert metrics["pass@4"] == 1.0  # p3 has 2 graded samples, fewer than 4: left out
