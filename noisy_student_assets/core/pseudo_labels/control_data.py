"""Training data of a round's controls (no Dagster here).

- *gold labels*: every unlabeled problem with its true answer: what the round would reach if every
  pseudo-label were kept and right. The one place the hidden gold trains anything, deliberately: the
  control is a yardstick, never a teacher.
- *random labels*: the kept problems with their pseudo-labels shuffled among them, which tells whether
  label correctness matters at all (on some models random rewards recover much of the gold-reward gain:
  Shao et al. 2025, "Spurious Rewards: Rethinking Training Signals in RLVR").
- *dosed gold labels*: every unlabeled problem with its true answer, except a share rho of them, drawn at random,
  whose answer is a wrong one: a label set of known accuracy 1 - rho, so that a student's gain can be read against
  the accuracy of its labels (the break-even of pseudo-labels).
- *gold labels on the kept problems*: the problems a label source kept, with their true answers: the source's
  coverage at perfect accuracy, which tells coverage apart from accuracy.
- *labeled only* needs no builder: the labeled problems alone.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN


def gold_revealed(unlabeled: pl.DataFrame) -> pl.DataFrame:
    """The unlabeled problems with their hidden gold as `gold_answer` (labeled-problem columns)."""
    return unlabeled.select("problem_id", "prompt", pl.col(HIDDEN_GOLD_COLUMN).alias("gold_answer"))


def shuffled_pseudo_labels(kept: pl.DataFrame, seed: int) -> pl.DataFrame:
    """`kept` (problem_id, prompt, pseudo_label) with the labels moved along one random cycle, so that no
    problem keeps its own label (Sattolo 1986, "An algorithm to generate a random cyclic permutation").

    Reads only problem_id, prompt and pseudo_label: the hidden gold cannot steer the shuffle. With fewer
    than two kept problems there is nothing to shuffle, and the labels stay as they are.
    """
    frame = kept.select("problem_id", "prompt", "pseudo_label")
    labels = frame["pseudo_label"].to_list()
    rng = np.random.default_rng(seed)
    order = list(range(len(labels)))
    for i in range(len(order) - 1, 0, -1):
        j = int(rng.integers(0, i))  # j < i: Sattolo's variant of Fisher-Yates
        order[i], order[j] = order[j], order[i]
    return frame.with_columns(pl.Series("pseudo_label", [labels[i] for i in order], dtype=pl.Utf8))


def kept_gold_labels(unlabeled: pl.DataFrame, kept: pl.DataFrame) -> pl.DataFrame:
    """The unlabeled problems among `kept` (a round's kept pseudo-labels) with their hidden gold as `gold_answer`."""
    return gold_revealed(unlabeled.join(kept.select("problem_id"), on="problem_id", how="semi"))


def dosed_gold_labels(
    unlabeled: pl.DataFrame,
    majority: pl.DataFrame,
    rho: float,
    seed: int,
    equivalent: Callable[[str, str], bool],
) -> pl.DataFrame:
    """The unlabeled problems (`gold_revealed`'s columns) with a `gold_answer` that is wrong on round(rho x n) of
    them, drawn by `seed`, and `replaced` marking those.

    A replaced problem's wrong answer is the teacher's majority answer (`majority`: problem_id, pseudo_label) where
    `equivalent` says it is not the true one: the error a teacher would make; else the first true answer of the other
    problems, in a random order, that is not equivalent to it. No problem can be made wrong when every other answer
    is equivalent to its own (ValueError)."""
    gold = gold_revealed(unlabeled)
    rng = np.random.default_rng(seed)
    replaced = set(rng.choice(gold.height, size=round(rho * gold.height), replace=False).tolist())
    teacher = dict(majority.select("problem_id", "pseudo_label").iter_rows())
    answers = gold["gold_answer"].to_list()
    labels = []
    for index, (problem_id, answer) in enumerate(zip(gold["problem_id"], answers, strict=True)):
        if index not in replaced:
            labels.append(answer)
            continue
        candidates = [teacher.get(problem_id)] + [answers[other] for other in rng.permutation(len(answers))]
        wrong = next((label for label in candidates if label is not None and not equivalent(answer, label)), None)
        if wrong is None:
            raise ValueError(f"problem {problem_id}: no wrong answer to give it (every answer is {answer!r})")
        labels.append(wrong)
    return gold.with_columns(
        pl.Series("gold_answer", labels, dtype=pl.Utf8),
        pl.Series("replaced", [index in replaced for index in range(gold.height)]),
    )
