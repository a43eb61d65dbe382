"""Rounds as partitions.

Round N's teacher is round N-1's student, so a round's assets depend on their own previous partition.
Dagster 1.13 accepts such a self-dependency only on time-window partitions, so rounds are a daily
time window that only looks like rounds: `fmt="round-%j"` turns 1900-01-01.. into `round-001`..
(`end` is exclusive). `PREVIOUS_ROUND` maps a round to the one before; round-001 has none, and its
teacher is the labeled-RL checkpoint instead.
"""

import dagster as dg

MAX_ROUNDS = 30

ROUNDS = dg.TimeWindowPartitionsDefinition(
    start="round-001",
    end=f"round-{MAX_ROUNDS + 1:03d}",
    fmt="round-%j",
    cron_schedule="0 0 * * *",
)

PREVIOUS_ROUND = dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)


def round_number(partition_key: str) -> int:
    """`round-007` -> 7."""
    prefix, _, number = partition_key.partition("-")
    if prefix != "round" or not number.isdigit():
        raise ValueError(f"{partition_key!r} is not a round partition key like 'round-001'")
    return int(number)


def round_key(number: int) -> str:
    """7 -> `round-007`."""
    if not 1 <= number <= MAX_ROUNDS:
        raise ValueError(f"round {number} is outside 1..{MAX_ROUNDS}")
    return f"round-{number:03d}"


def previous_round_key(partition_key: str) -> str | None:
    """The round before, or None for round-001 (whose teacher is the labeled-RL checkpoint)."""
    number = round_number(partition_key)
    return round_key(number - 1) if number > 1 else None
