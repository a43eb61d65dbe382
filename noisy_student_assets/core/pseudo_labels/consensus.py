"""Voting over a problem's sampled answers, clustering answers by mathematical equivalence: a head count
(`majority_vote`), or each answer weighted by a label source's judgement of its sample (`weighted_vote`).

Clustering is greedy and deterministic: distinct answers (after stripping whitespace) are visited
most frequent first, ties by first occurrence in the input, and each joins the first cluster whose
founder - its first, hence most frequent, member - is equivalent to it (``answers_equivalent``
with the founder as gold), or founds a new one.  The founder represents the cluster.  The winning
cluster is the largest; ties go to the cluster with the earliest first occurrence in the input.
Missing, empty and ungradable answers (see ``grading.is_gradable``) join no cluster, so they never
win, but they do count in ``k``.  An answer whose check is ungraded (``grading``: it could not
finish) - on itself, or against a founder when it matches no other founder - joins no cluster and
founds none, since it may equal that founder; it counts in ``k`` and in ``Vote.ungraded``.

A weighted vote clusters the same way; a cluster weighs the sum of its samples' weights, the heaviest wins (ties:
the larger cluster, then the earliest first occurrence), and agreement is the winner's share of all ``k`` samples'
weight, missing answers' included. With every weight 1 it is the head count, to the last digit. A cluster of no
weight never wins: with no weight anywhere there is no label.
"""

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from noisy_student_assets.core.grading import answers_equivalent, is_gradable


@dataclass(frozen=True)
class Vote:
    """Outcome of a majority vote over ``k`` sampled answers."""

    answer: str | None
    """The winning cluster's representative (its most frequent exact string), or None if no cluster."""
    count: int
    """Answers in the winning cluster."""
    agreement: float
    """The winner's share of the vote's weight, ``count / k`` in a head count: missing and ungradable answers count
    against agreement."""
    n_clusters: int
    """Distinct equivalence clusters among the gradable answers."""
    entropy: float
    """Shannon entropy (nats) of the cluster weights over the gradable answers only, so that it
    measures disagreement among the answers given; failures to answer show in ``agreement``."""
    k: int
    """Number of answers voted on, missing ones included."""
    ungraded: int = 0
    """Answers left out of every cluster because a check on them was ungraded; counted in ``k``."""
    runner_up: int = 0
    """Answers in the cluster that came second (0 where only one cluster or none): the winner's lead over it is
    ``count - runner_up`` votes."""


def majority_vote(answers: list[str | None]) -> Vote:
    """The majority answer of ``answers`` up to mathematical equivalence (see module docstring)."""
    return weighted_vote(answers, [1.0] * len(answers))


def weighted_vote(answers: list[str | None], weights: Sequence[float]) -> Vote:
    """The answer of ``answers`` whose equivalence cluster weighs most, ``weights[i]`` being sample i's (see
    module docstring). A ValueError for a weight that is negative or not finite: it would decide the vote silently."""
    if len(weights) != len(answers):
        raise ValueError(f"{len(weights)} weights for {len(answers)} answers")
    bad = [w for w in weights if not (math.isfinite(w) and w >= 0)]
    if bad:
        raise ValueError(
            f"vote weights must be finite and >= 0, got {bad[0]!r}: the label source scored a sample it cannot judge"
        )
    clusters, ungraded = _clusters(answers, weights)
    k = len(answers)
    clusters = [cluster for cluster in clusters if cluster.weight > 0]
    if not clusters:
        return Vote(answer=None, count=0, agreement=0.0, n_clusters=0, entropy=0.0, k=k, ungraded=ungraded)
    winner = clusters[0]
    total = sum(cluster.weight for cluster in clusters)
    shares = [cluster.weight / total for cluster in clusters]
    return Vote(
        answer=winner.representative,
        count=winner.size,
        agreement=winner.weight / math.fsum(weights),
        n_clusters=len(clusters),
        entropy=sum(-p * math.log(p) for p in shares),
        k=k,
        ungraded=ungraded,
        runner_up=clusters[1].size if len(clusters) > 1 else 0,
    )


def vote_shares(answers: list[str | None]) -> list[tuple[str, float]]:
    """Every equivalence cluster of ``answers`` as (representative, size / k), the majority first: the
    soft pseudo-reward of an answer is the share of the cluster it falls in (0 outside every cluster)."""
    return [
        (cluster.representative, cluster.size / len(answers)) for cluster in _clusters(answers, [1.0] * len(answers))[0]
    ]


@dataclass(frozen=True)
class _Cluster:
    representative: str
    size: int
    weight: float
    first_seen: int


def _clusters(answers: list[str | None], weights: Sequence[float]) -> tuple[list[_Cluster], int]:
    """The equivalence clusters of the gradable answers, heaviest first (ties: the larger, then the earliest first
    occurrence), and the number of answers left out because a check on them was ungraded."""
    stripped = [(a.strip(), w) for a, w in zip(answers, weights, strict=True) if isinstance(a, str)]
    counts = Counter(a for a, _ in stripped if a)  # keys in first-occurrence order
    weight_of: dict[str, list[float]] = {}
    for answer, weight in stripped:
        weight_of.setdefault(answer, []).append(weight)
    first_seen = {answer: rank for rank, answer in enumerate(counts)}
    members: list[list[str]] = []
    ungraded = 0
    for answer in sorted(counts, key=lambda a: -counts[a]):  # stable: ties keep first occurrence
        gradable = is_gradable(answer)
        if not gradable:
            ungraded += counts[answer] if gradable is None else 0
            continue
        unsure = False
        for cluster in members:
            verdict = answers_equivalent(cluster[0], answer)
            if verdict:
                cluster.append(answer)
                break
            unsure = unsure or verdict is None
        else:  # in no cluster: new, unless a founder it could not be compared with is its equal
            if unsure:
                ungraded += counts[answer]
            else:
                members.append([answer])
    clusters = [
        _Cluster(
            c[0],
            sum(counts[a] for a in c),
            math.fsum(w for a in c for w in weight_of[a]),
            min(first_seen[a] for a in c),
        )
        for c in members
    ]
    return sorted(clusters, key=lambda c: (-c.weight, -c.size, c.first_seen)), ungraded
