"""Training data of a round's controls (no Dagster here).

- *gold labels*: every unlabeled problem with its true answer: what the round would reach if every
  pseudo-label were kept and right. The one place the hidden gold trains anything, deliberately: the
  control is a yardstick, never a teacher.
- *random labels*: the kept problems with their pseudo-labels shuffled among them, which tells whether
  label correctness matters at all (on some models random rewards recover much of the gold-reward gain:
  Shao et al. 2025, "Spurious Rewards: Rethinking Training Signals in RLVR").
- *labeled only* needs no builder: the labeled problems alone.
"""

from __future__ import annotations

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
