"""Which round of an arm comes next (no Dagster here): the rule the `next_round_sensor` applies.

Round 1 starts once the arm's labeled-RL checkpoint is evaluated; round N > 1 once round N-1's eval report
exists and did not regress (its `no_eval_regression` check passed). A round past the arm's experiment's
`rounds` never starts, and neither does a round out of order: the UI offers only the next one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RoundState:
    """What the instance knows of one round of one arm."""

    evaluated: bool
    """The round's eval report is materialized."""
    regressed: bool = False
    """The latest `no_eval_regression` check of that report failed."""


def next_round(labeled_rl_evaluated: bool, rounds: Sequence[RoundState], planned: int) -> int | None:
    """The round to launch next (numbered from 1), or None: nothing is ready, the last evaluated round
    regressed, or all `planned` rounds are done. `rounds[i]` is round i + 1."""
    if not labeled_rl_evaluated:
        return None
    for number, state in enumerate(rounds[:planned], start=1):
        if not state.evaluated:
            teacher_regressed = number > 1 and rounds[number - 2].regressed
            return None if teacher_regressed else number
    return None
