"""What a round's student trains on in each `student.mode`, built from the teacher's samples and its vote
(no Dagster here). None of these read an answer key: they see the pseudo-labels and the samples only.

- *agreement band*: the kept problems whose vote agreement lies in [low, high]. Keeping the high-agreement
  problems is the difficulty filter that other self-training work found prevents collapse; an upper edge
  below 1 drops the problems the teacher already finds trivial.
- *SFT rows* (`sft`): rejection sampling on consensus, i.e. the teacher's own samples whose answer agrees
  with the kept pseudo-label (RFT, Yuan et al. 2023, "Scaling Relationship on Learning Mathematical
  Reasoning with Large Language Models"; STaR, Zelikman et al. 2022, with the vote in place of the gold).
- *DPO pairs* (`dpo`): a sample agreeing with the majority preferred over one that does not, from problems
  with at least one dissenting sample (ScPO, Prasad et al. 2024, "Self-Consistency Preference
  Optimization": the most-voted answer chosen, the least-voted rejected).
- *vote shares* (`reward: vote_share`): each answer cluster's share of the K votes, a soft pseudo-reward.

A sample whose agreement with the label is ungraded (`grading`) is neither agreeing nor dissenting: it is in no
SFT row and no DPO pair, and its vote share is None (no reward signal).

Each problem contributes a group of `group_size` completions (SFT rows, or DPO pairs x 2), the shape of a
GRPO step's group, so that a step of any mode trains on the same prompts x completions as a GRPO step and
the compute-matched controls stay matched.
"""

from __future__ import annotations

import json
from itertools import cycle, islice

import polars as pl

from noisy_student_assets.core.grading import Verdict, answers_equivalent
from noisy_student_assets.core.pseudo_labels.consensus import vote_shares

SFT_ROW_SCHEMA = pl.Schema({"problem_id": pl.Utf8, "prompt": pl.Utf8, "completion": pl.Utf8})
DPO_PAIR_SCHEMA = pl.Schema({"problem_id": pl.Utf8, "prompt": pl.Utf8, "chosen": pl.Utf8, "rejected": pl.Utf8})
VOTE_SHARE_SCHEMA = pl.Schema({"problem_id": pl.Utf8, "vote_shares": pl.Utf8})


def labeled_rows(labeled: pl.DataFrame, pseudo_only: bool) -> pl.DataFrame:
    """The labeled problems a round's student (and its gold- and random-label controls) trains on beside its other
    rows: all of them, or none with `pseudo_only` (training on pseudo-labels alone, as SRT and TTRL do)."""
    return labeled.clear() if pseudo_only else labeled


def in_agreement_band(labels: pl.DataFrame, low: float, high: float) -> pl.DataFrame:
    """The rows of `labels` whose agreement is within [low, high]."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"the agreement band needs 0 <= low <= high <= 1, got [{low}, {high}]")
    return labels.filter(pl.col("agreement").is_between(low, high))


def _samples_by_problem(generations: pl.DataFrame) -> dict[str, list[tuple[str, str | None]]]:
    """problem_id -> [(completion, answer)] in sample order; only these columns of the samples are read."""
    grouped = (
        generations.select("problem_id", "sample_index", "completion", "answer")
        .sort("problem_id", "sample_index")
        .group_by("problem_id", maintain_order=True)
        .agg("completion", "answer")
    )
    return {pid: list(zip(completions, answers, strict=True)) for pid, completions, answers in grouped.iter_rows()}


def _kept_labels(pseudo_labels: pl.DataFrame) -> pl.DataFrame:
    return pseudo_labels.filter("kept").select("problem_id", "prompt", "pseudo_label")


def _agrees(label: str, answer: str | None) -> Verdict:
    return answer is not None and answers_equivalent(label, answer)


def sft_rows(
    generations: pl.DataFrame, pseudo_labels: pl.DataFrame, group_size: int, distinct_per_problem: int = 0
) -> pl.DataFrame:
    """Per kept problem, `group_size` rows of (prompt, completion) from the samples whose answer agrees with
    its pseudo-label: the first `distinct_per_problem` of them (0: all), repeated in turn to fill the group.
    Problems keep the order of `pseudo_labels`; one with no agreeing sample gives no rows."""
    if group_size < 1 or distinct_per_problem < 0:
        raise ValueError(
            f"group_size must be >= 1 and distinct_per_problem >= 0, got {group_size}, {distinct_per_problem}"
        )
    samples = _samples_by_problem(generations)
    rows = []
    for problem_id, prompt, label in _kept_labels(pseudo_labels).iter_rows():
        agreeing = [completion for completion, answer in samples.get(problem_id, []) if _agrees(label, answer)]
        if distinct_per_problem:
            agreeing = agreeing[:distinct_per_problem]
        if agreeing:
            rows += [
                {"problem_id": problem_id, "prompt": prompt, "completion": c}
                for c in islice(cycle(agreeing), group_size)
            ]
    return pl.DataFrame(rows, schema=SFT_ROW_SCHEMA)


def dpo_pairs(generations: pl.DataFrame, pseudo_labels: pl.DataFrame, pairs_per_problem: int) -> pl.DataFrame:
    """Per kept problem with at least one dissenting sample, `pairs_per_problem` (chosen, rejected) pairs:
    chosen samples agree with the pseudo-label, in sample order; rejected ones do not, the least-voted
    answers first and samples without an answer last; both lists repeat in turn to fill the pairs."""
    if pairs_per_problem < 1:
        raise ValueError(f"pairs_per_problem must be >= 1, got {pairs_per_problem}")
    samples = _samples_by_problem(generations)
    rows = []
    for problem_id, prompt, label in _kept_labels(pseudo_labels).iter_rows():
        problem_samples = samples.get(problem_id, [])
        chosen = [completion for completion, answer in problem_samples if _agrees(label, answer)]
        dissent = [(completion, answer) for completion, answer in problem_samples if _agrees(label, answer) is False]
        if not chosen or not dissent:
            continue
        rejected = _least_voted_first(dissent)
        pairs = islice(zip(cycle(chosen), cycle(rejected)), pairs_per_problem)
        rows += [{"problem_id": problem_id, "prompt": prompt, "chosen": c, "rejected": r} for c, r in pairs]
    return pl.DataFrame(rows, schema=DPO_PAIR_SCHEMA)


def _least_voted_first(dissent: list[tuple[str, str | None]]) -> list[str]:
    """The dissenting completions ordered by their answer's vote share among them, rarest first (stable),
    unanswered ones last."""
    shares = vote_shares([answer for _, answer in dissent])

    def share(answer: str | None) -> float:
        return next((s for representative, s in shares if _agrees(representative, answer)), 2.0)

    return [completion for completion, answer in sorted(dissent, key=lambda item: share(item[1]))]


def vote_share_table(generations: pl.DataFrame, pseudo_labels: pl.DataFrame) -> pl.DataFrame:
    """Per kept problem, its answer clusters and their vote shares as JSON ([[representative, share], ...],
    the majority first): the targets of the `vote_share` reward."""
    samples = _samples_by_problem(generations)
    rows = [
        {
            "problem_id": problem_id,
            "vote_shares": json.dumps(vote_shares([answer for _, answer in samples.get(problem_id, [])])),
        }
        for problem_id in _kept_labels(pseudo_labels)["problem_id"]
    ]
    return pl.DataFrame(rows, schema=VOTE_SHARE_SCHEMA)


def vote_share_of(answer: str | None, shares: list[list]) -> float | None:
    """The vote share of the cluster `answer` falls in (0 when it falls in none, or is missing; None when it falls
    in none but a check against a cluster was ungraded)."""
    verdicts = []
    for representative, share in shares:
        verdicts.append(_agrees(representative, answer))
        if verdicts[-1]:
            return float(share)
    return None if None in verdicts else 0.0
