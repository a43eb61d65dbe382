"""What a materialization was made of, recorded with Dagster's own code and data versions.

- An asset's **code version** is its stage's version (`Settings.stage_version`, raised by hand when the stage's
  computation changes), its op's default config (the profile's defaults) and its parents' code versions. So a
  changed default (K's, say) or another profile changes the code version of the asset that reads it and of every
  asset downstream, and the UI shows exactly those as unsynced ("has a new code version") before anything runs.
- A materialization's **data version** is its fingerprint: the stage's version, the effective settings it ran with
  (profile defaults, run config and arm overrides, resolved: its `config` metadata), the compute settings of a heavy
  stage, and the data versions of the inputs it read. An identical re-run gets the same data version, so nothing
  downstream turns unsynced; the grid redoes an asset exactly when the fingerprint it would get now differs from
  the recorded one (`stale_assets`).

A materialization made before data versions were recorded has Dagster's own data version; its fingerprint is
rebuilt from its `config` metadata and the input materializations Dagster recorded it read (`recorded`).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import dagster as dg

from noisy_student_assets.core.profiles import active_profile
from noisy_student_assets.core.settings import Settings, resolved
from noisy_student_assets.defs.config import StageConfig, with_arm
from noisy_student_assets.defs.records import latest_materialization
from resources.compute import DEVICE_POOL

DATA_VERSION_TAG = "dagster/data_version"  # Dagster records every data version under this tag
MISSING = "missing"
"""The data version an input that was never materialized counts with, in the asset and in the grid alike."""
STAGE_VERSION_KEY = "stage_version"
"""The metadata entry that names the stage version a materialization was made by."""


def fingerprint(stage_version: str, settings: Mapping, inputs: Mapping[str, str]) -> str:
    """The data version of a materialization made by `stage_version` with `settings` from inputs of these data versions."""
    return _digest({"stage": stage_version, "settings": settings, "inputs": inputs}, 24)


def _digest(made_of: Mapping, length: int) -> str:
    return hashlib.sha256(json.dumps(made_of, sort_keys=True, default=str).encode()).hexdigest()[:length]


def config_class(assets_def: dg.AssetsDefinition) -> type[StageConfig] | None:
    """The run config class of an asset's op (None: it takes no config)."""
    param = assets_def.op.compute_fn.get_config_arg() if assets_def.op.compute_fn.has_config_arg() else None
    return (
        param.annotation
        if param is not None and isinstance(param.annotation, type) and issubclass(param.annotation, StageConfig)
        else None
    )


def stage_version(config: type[StageConfig] | None) -> str:
    """The hand-raised version of the stage a config configures ('TeacherSamplingSettings@1'; 'none@0' without config)."""
    settings: type[Settings] | None = config.settings_class if config is not None else None
    return f"{settings.__name__}@{settings.stage_version}" if settings is not None else "none@0"


def run_settings(config: StageConfig | None, arm) -> dict:
    """The settings a stage runs with: the run config with the arm's overrides, every default filled in (the
    `config` metadata of its materializations)."""
    return resolved(with_arm(config, arm)[0]) if config is not None else {}


def made_with(run_config: Mapping, compute: Mapping | None, profile: str) -> dict:
    """What of its settings a materialization's fingerprint covers: its run settings, a heavy stage's compute settings
    (device, precision: they change what it produces) and the profile, so that a lake is never silently shared
    across profiles."""
    return {"config": dict(run_config), "profile": profile} | (
        {"compute": dict(compute)} if compute is not None else {}
    )


def data_version_of(record) -> str:
    """The data version of a materialization record, as the assets that read it record it."""
    return record.asset_materialization.tags.get(DATA_VERSION_TAG) or str(record.storage_id)


def input_data_versions(
    instance: dg.DagsterInstance, graph, key: dg.AssetKey, partition: str | None
) -> dict[str, str] | None:
    """The data version of each input of `key`'s materialization in `partition`: each parent's latest, of the same
    partition where the parent is partitioned (`MISSING` where it has none). None where an input spans partitions
    (the verdict reads every arm): such an asset keeps Dagster's own data version."""
    versions = {}
    for parent in graph.get(key).parent_keys:
        parent_partitioned = graph.get(parent).is_partitioned
        if parent_partitioned and partition is None:
            return None
        record = latest_materialization(instance, parent, partition if parent_partitioned else None)
        versions[parent.to_user_string()] = data_version_of(record) if record else MISSING
    return versions


def reuse_key(content_key: str, settings: Settings) -> str:
    """The key an identical published run is reused by (`DataLake.recall`): the run's content key under the version
    of the stage that computes it (`settings`' class), so that a raised stage version reuses nothing made before it.
    At version 1 it is the content key itself, which a lake made before stage versions is indexed by."""
    version = type(settings).stage_version
    return content_key if version == 1 else _digest({"content": content_key, "stage_version": version}, 64)


def is_heavy(op: dg.OpDefinition) -> bool:
    """Whether an op runs a heavy stage (sampling, training, evaluation: the `device` pool's)."""
    return op.pool == DEVICE_POOL


def with_code_versions(definitions: dg.Definitions) -> dg.Definitions:
    """`definitions` with every asset's code version set (see the module docstring)."""
    assets_defs = {key: assets_def for assets_def in definitions.assets for key in assets_def.keys}
    versions: dict[dg.AssetKey, str] = {}

    def version(key: dg.AssetKey) -> str:
        if key not in versions:
            assets_def = assets_defs[key]
            config = config_class(assets_def)
            made_of = {
                "stage": stage_version(config),
                "defaults": config().model_dump() if config is not None else {},
                "parents": sorted(version(parent) for parent in assets_def.asset_deps[key]),
            }
            versions[key] = _digest(made_of, 16)
        return versions[key]

    with (
        warnings.catch_warnings()
    ):  # a preview API of Dagster's: its warning would print on every load of the code location
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return definitions.map_asset_specs(func=lambda spec: spec.replace_attributes(code_version=version(spec.key)))


@dataclass(frozen=True)
class Recorded:
    """What the latest materialization of an asset (partition) says it was made of."""

    data_version: str
    """Its data version, as its children record it among their inputs."""
    fingerprint: str
    """Its fingerprint: the data version where the pipeline set it, else rebuilt from its `config` metadata."""
    settings: dict
    stage_version: str | None


def recorded(record, stage: str, compute: Mapping | None, inputs_now: Mapping[str, tuple[int, str]]) -> Recorded | None:
    """What the materialization `record` (an `EventLogRecord`, or None) was made of.

    A materialization made before fingerprints gets one rebuilt from its `config` metadata, the current version
    `stage` of its stage, `compute` (the compute settings of a heavy stage) and the active profile (neither recorded
    then), and its inputs: each input's data version now (`inputs_now`: its latest materialization's storage id and
    data version) where the materialization Dagster recorded it read is that latest one, else a stand-in that
    matches no data version. (Dagster records a partitioned input's data version in a form of its own, so the
    recorded input versions cannot be compared with the inputs' own.)"""
    if record is None:
        return None
    materialization = record.asset_materialization
    tags = materialization.tags or {}
    metadata = materialization.metadata
    profile = metadata["profile"].value if "profile" in metadata else active_profile()
    settings = made_with(metadata["config"].value if "config" in metadata else {}, compute, profile)
    data_version = data_version_of(record)
    provenance = dg.DataProvenance.from_tags(tags)
    if provenance is not None and provenance.is_user_provided:
        made_of = data_version
    else:
        read = {
            key.to_user_string(): storage_id
            for key, storage_id in (provenance.input_storage_ids if provenance else {}).items()
        }
        inputs = {
            name: version if read.get(name) == storage_id else f"another materialization ({read.get(name)})"
            for name, (storage_id, version) in inputs_now.items()
        }
        made_of = fingerprint(stage, settings, inputs)
    return Recorded(
        data_version, made_of, settings, metadata[STAGE_VERSION_KEY].value if STAGE_VERSION_KEY in metadata else None
    )


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
