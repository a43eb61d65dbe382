"""What is current (no Dagster here): the one rule by which the grid, the next-round automation and the lineage judge
an asset's latest materialization. Pure functions over frozen states; the Dagster layer reads the instance into them.

- A materialization's **fingerprint** is what it was made of: its stage's version, its effective settings and its
  inputs' data versions. The pipeline records it as the materialization's data version (`defs/lineage.py`).
- **`stale_assets`** (the grid, `grid plan`): an asset is redone when it was never materialized, an input of it is
  redone, or the fingerprint it would get now differs from the recorded one.
- **`round_not_due`** (the next-round automation, and through it the grid's stopping rule): round N of an arm is due
  when each asset before it is current as the instance recorded it (`not_current`: materialized, after its inputs'
  latest materializations, its blocking checks passed) and the arm's stopping rule lets round N run.

`import-linter` (pyproject.toml) lets only the lineage, the grid and the automation import this module: a fourth
place that judges what is current would have to say so there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from noisy_student_assets.core.experiments.progress import stop_reason
from noisy_student_assets.core.settings import RoundsSettings

MISSING = "missing"
"""The data version an input that was never materialized counts with, in the asset and in the grid alike."""


def digest(made_of: Mapping, length: int) -> str:
    """A hex digest of `made_of` (JSON with sorted keys), `length` characters long."""
    return hashlib.sha256(json.dumps(made_of, sort_keys=True, default=str).encode()).hexdigest()[:length]


def fingerprint(stage_version: str, settings: Mapping, inputs: Mapping[str, str]) -> str:
    """The data version of a materialization made by `stage_version` with `settings` from inputs of these data
    versions."""
    return digest({"stage": stage_version, "settings": settings, "inputs": inputs}, 24)


@dataclass(frozen=True)
class Recorded:
    """What the latest materialization of an asset (partition) says it was made of."""

    data_version: str
    """Its data version, as its children record it among their inputs."""
    fingerprint: str
    """Its fingerprint: the data version where the pipeline set it, else rebuilt from its `config` metadata."""
    settings: dict
    stage_version: str | None


def stale_assets(
    targets: list[str],
    parents: Mapping[str, Iterable[str]],
    stages: Mapping[str, str],
    settings: Mapping[str, dict],
    latest: Mapping[str, Recorded | None],
) -> dict[str, str]:
    """The targets to (re)materialize, in `targets` order (dependencies first), each with its reason.

    An asset is redone when it was never materialized or the fingerprint it would get now (its stage version in
    `stages`, its `settings` and its inputs' data versions: a redone input's new fingerprint, else its recorded
    data version) differs from its recorded one, so whatever reads a redone asset is redone too. `latest` holds
    what is recorded of every target and of every parent outside the targets."""
    now: dict[str, str] = {}
    stale: dict[str, str] = {}
    for name in targets:
        inputs = {
            parent: now.get(parent) or (latest[parent].data_version if latest.get(parent) else MISSING)
            for parent in parents[name]
        }
        now[name] = fingerprint(stages[name], settings[name], inputs)
        before, redone_inputs = latest.get(name), [parent for parent in parents[name] if parent in stale]
        if before is None:
            stale[name] = "never materialized"
        elif redone_inputs:  # even to the same fingerprint: sampling on a GPU, say, need not give the same content
            stale[name] = f"input {', '.join(redone_inputs)} redone"
        elif before.fingerprint != now[name]:
            stale[name] = _why(before, stages[name], settings[name])
        else:
            now[name] = before.data_version
    return stale


def _why(before: Recorded, stage: str, settings: dict) -> str:
    """The plainest reason a recorded materialization is out of date."""
    changed = _changed(before.settings, settings)
    if changed:
        return "settings changed: " + "; ".join(changed)
    if before.stage_version not in (None, stage):
        return f"stage version {before.stage_version} -> {stage}"
    return "an input has another data version than it was made from"


def _changed(before: Mapping, now: Mapping, prefix: str = "") -> list[str]:
    """'config.k: 8 -> 6' for each leaf setting that differs."""
    changes = []
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key), now.get(key)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            changes += _changed(old, new, f"{prefix}{key}.")
        elif old != new:
            changes.append(f"{prefix}{key}: {json.dumps(old, default=str)} -> {json.dumps(new, default=str)}")
    return changes


def own_code_changes(
    before_stage: str | None, before_defaults: Mapping | None, stage: str, defaults: Mapping
) -> list[str]:
    """What of an asset's own code changed since a materialization (its code version's part that is not its
    parents'), as `grid plan` names settings: each default ('default changed: config.k: 8 -> 6') and a new stage
    version; that its defaults went unrecorded where `before_defaults` is None (a materialization made before they
    were) and the stage has any."""
    reasons = []
    if before_defaults is None:
        if defaults:
            reasons.append("made before its defaults were recorded")
    else:
        changed = _changed(before_defaults, defaults, "config.")
        if changed:
            reasons.append("default changed: " + "; ".join(changed))
    if before_stage not in (None, stage):
        reasons.append(f"stage version {before_stage} -> {stage}")
    return reasons


@dataclass(frozen=True)
class Latest:
    """An asset partition's latest materialization as the next-round automation reads it."""

    name: str
    storage_id: int | None
    """Where the instance stored it (later materializations have larger ids); None: never materialized."""
    inputs: Mapping[str, int] = field(default_factory=dict)
    """The storage id of each of its inputs' latest materialization (an input never materialized: absent)."""
    failed_checks: tuple[str, ...] = ()
    """Its blocking checks that did not pass on it (or never judged it)."""


def not_current(latest: Latest) -> str | None:
    """Why an asset's latest materialization does not stand for what a round reads, or None when it does."""
    if latest.storage_id is None:
        return f"{latest.name} is not materialized"
    newer = sorted(name for name, storage_id in latest.inputs.items() if storage_id > latest.storage_id)
    if newer:
        return f"{latest.name} was materialized before its input {', '.join(newer)} (not redone since)"
    if latest.failed_checks:
        failed = ", ".join(latest.failed_checks)
        return f"{latest.name}: blocking check {failed} did not pass on its latest materialization"
    return None


def round_not_due(
    before: Iterable[Latest],
    rule: RoundsSettings,
    done: int,
    validation: Callable[[], Sequence[float] | None],
) -> str | None:
    """Why the round after round `done` is not due, or None when it is: each asset it reads (`before`, in dependency
    order; read lazily, up to the first that is not current) is current, and the stopping rule `rule` lets it run on
    the accuracies `validation` reads, once every asset is current (`progress.stop_reason`; None: a validation eval
    the rule reads is not recorded)."""
    for latest in before:
        if reason := not_current(latest):
            return reason
    accuracies = validation()
    if accuracies is None:
        return "a validation eval its patience reads is not materialized"
    return stop_reason(rule, done, accuracies)
