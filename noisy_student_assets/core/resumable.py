"""What a killed stage left that a retry may resume from, and what it must set aside (no Dagster here).

A stage keeps resumable state in its work directory: TRL's checkpoints (`checkpoint-N/`) and finished shards of
samples. A SIGKILL can land while either is written; the next attempt resumes only from what is whole and moves
the rest aside (`SET_ASIDE_PREFIX`, which no reader globs), telling `SetAside` why, so that a partial write stops no
stage for good and no half-written file passes for done. What is set aside goes with the work directory once the
stage publishes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path

import polars as pl

SetAside = Callable[[str], None]
"""Told, in a sentence, of each partial file or directory moved aside (a stage's warning and metadata)."""

SET_ASIDE_PREFIX = "incomplete-"
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
"""transformers' name for a resumable checkpoint (`PREFIX_CHECKPOINT_DIR`-N), as `get_last_checkpoint` matches it."""
TRAINER_STATE_FILE = "trainer_state.json"
WEIGHTS_FILES = (
    "adapter_model.safetensors",
    "model.safetensors",
    "model.safetensors.index.json",
    "adapter_model.bin",
    "pytorch_model.bin",
)
"""One of these holds a checkpoint's trained weights: a LoRA adapter, or the whole model (one file or sharded)."""
RESUME_STATE_FILES = ("optimizer.pt", "scheduler.pt")
"""Without them transformers resumes silently with a fresh optimizer and schedule: another run than the one killed."""

_log = logging.getLogger(__name__)


def checkpoint_gaps(checkpoint: Path) -> list[str]:
    """Why transformers could not resume `checkpoint` as the run that saved it would have gone on: each missing or
    empty file it needs, a trainer state that does not parse. Empty: whole. The Trainer writes the trainer state
    last, after the weights and the optimizer's and scheduler's state."""
    gaps = []
    if not any(_non_empty(checkpoint / name) for name in WEIGHTS_FILES):
        gaps.append("no weights")
    gaps += [f"no {name}" for name in RESUME_STATE_FILES if not _non_empty(checkpoint / name)]
    state = checkpoint / TRAINER_STATE_FILE
    if not state.is_file():
        gaps.append(f"no {TRAINER_STATE_FILE}")
    else:
        try:
            json.loads(state.read_text())["global_step"]
        except (ValueError, KeyError, TypeError):
            gaps.append(f"{TRAINER_STATE_FILE} is cut short")
    return gaps


def checkpoints_newest_first(work_dir: Path) -> list[Path]:
    if not work_dir.is_dir():
        return []
    found = [path for path in work_dir.iterdir() if path.is_dir() and CHECKPOINT_PATTERN.match(path.name)]
    return sorted(found, key=lambda path: int(CHECKPOINT_PATTERN.match(path.name).group(1)), reverse=True)


def latest_whole_checkpoint(work_dir: Path) -> Path | None:
    """The newest checkpoint in `work_dir` a training can resume from; None where there is none."""
    return next((path for path in checkpoints_newest_first(work_dir) if not checkpoint_gaps(path)), None)


def resume_point(work_dir: Path, set_aside: SetAside | None = None) -> Path | None:
    """The newest whole checkpoint in `work_dir` (`latest_whole_checkpoint`), with every newer, incomplete one moved
    aside first (transformers resumes from the highest-numbered `checkpoint-N` and would fail on it, attempt after
    attempt, and its rotation would count it as the one to keep); each is told to `set_aside`."""
    tell = set_aside or _log.warning
    for checkpoint in checkpoints_newest_first(work_dir):
        gaps = checkpoint_gaps(checkpoint)
        if not gaps:
            return checkpoint
        try:
            moved = move_aside(checkpoint)
        except FileNotFoundError:  # another rank of the same training moved it first, and tells of it
            continue
        older = latest_whole_checkpoint(work_dir)
        tell(
            f"{checkpoint.name} was incomplete ({', '.join(gaps)}; a run killed while saving it): set aside as "
            f"{moved.name}; " + (f"resumed from {older.name}" if older else "no whole checkpoint: training starts over")
        )
    return None


def whole_parquet(path: Path, schema: pl.Schema, set_aside: SetAside | None = None) -> pl.DataFrame | None:
    """The table in `path`; None where the file does not read whole as a table of `schema` (a write cut short, a
    disk that lost it), the file then moved aside and told to `set_aside`."""
    try:
        table = pl.read_parquet(path)
        why = None if table.schema == schema else f"columns {dict(table.schema)} are not {dict(schema)}"
    except (OSError, pl.exceptions.PolarsError) as error:
        why = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'unreadable'}"
    if why is None:
        return table
    moved = move_aside(path)
    (set_aside or _log.warning)(f"{path.name} in {path.parent} is not a whole table ({why}): set aside as {moved.name}")
    return None


def move_aside(path: Path) -> Path:
    """Rename `path` within its directory to a name no reader takes for its own (`SET_ASIDE_PREFIX`)."""
    moved = path.with_name(f"{SET_ASIDE_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}")
    os.replace(path, moved)
    return moved


def _non_empty(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0
