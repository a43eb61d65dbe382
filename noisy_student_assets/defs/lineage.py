"""What a materialization was made of, recorded with Dagster's own code and data versions.

- An asset's **code version** is its stage's version (`Settings.stage_version`, raised by hand when the stage's
  computation changes), its op's default config (the profile's defaults) and its parents' code versions (in the
  graph of every asset some arm could run, so every view of the experiments agrees on it). So a changed default
  (K's, say) or another profile changes the code version of the asset that reads it and of every asset downstream
  (but the verdict, which reads every arm and covers its own stage alone), and the UI shows exactly those as
  unsynced ("has a new code version") before anything runs.
- A materialization's **data version** is its fingerprint: the stage's version, the effective settings it ran with
  (profile defaults, run config and arm overrides, resolved: its `config` metadata), the compute settings of a heavy
  stage, and the data versions of the inputs it read. An identical re-run gets the same data version, so nothing
  downstream turns unsynced; the grid redoes an asset exactly when the fingerprint it would get now differs from
  the recorded one (`core/staleness.py`, the one rule of what is current).

A materialization made before data versions were recorded has Dagster's own data version; its fingerprint is
rebuilt from its `config` metadata and the input materializations Dagster recorded it read (`recorded`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import dagster as dg

from noisy_student_assets.core.profiles import active_profile
from noisy_student_assets.core.settings import ComputeSettings, Settings, resolved
from noisy_student_assets.core.staleness import MISSING, Recorded, digest, fingerprint
from noisy_student_assets.defs.config import StageConfig, with_arm
from noisy_student_assets.defs.records import latest_materialization
from resources.compute import DEVICE_POOL

DATA_VERSION_TAG = "dagster/data_version"  # Dagster records every data version under this tag
CODE_VERSION_TAG = "dagster/code_version"  # and a materialization's code version under this one
STAGE_VERSION_KEY = "stage_version"
DEFAULTS_KEY = "defaults"
"""The metadata entry that names the stage version a materialization was made by."""


def config_class(assets_def: dg.AssetsDefinition) -> type[StageConfig] | None:
    """The run config class of an asset's op (None: it takes no config)."""
    param = assets_def.op.compute_fn.get_config_arg() if assets_def.op.compute_fn.has_config_arg() else None
    return (
        param.annotation
        if param is not None and isinstance(param.annotation, type) and issubclass(param.annotation, StageConfig)
        else None
    )


def stage_defaults(config: type[StageConfig] | None) -> tuple[str, dict]:
    """What an asset's code version covers of its own, for its op's config class (`config_class`): its stage's
    version and its default config (JSON); a materialization records both (`STAGE_VERSION_KEY`, `DEFAULTS_KEY`)."""
    return stage_version(config), config().model_dump(mode="json") if config is not None else {}


def run_config_of(assets_def: dg.AssetsDefinition, op_config: Mapping) -> StageConfig:
    """The config an asset's op runs with under `op_config` (a run config's `ops.<op>.config`), as Dagster resolves
    it: a nested block given in part keeps the rest of the stage's own default block (a student's `grpo:
    {max_steps: 1}` keeps its completion cap, labeled RL's its 6 steps), where the config class built from the dict
    would take the block class's defaults."""
    from dagster._config import process_config  # Dagster's own resolution of a run config against a schema

    resolved = process_config(assets_def.op.config_schema.config_type, dict(op_config))
    if not resolved.success:
        raise ValueError(f"the run config of {assets_def.op.name}: {[error.message for error in resolved.errors]}")
    return config_class(assets_def)(**resolved.value)


def stage_version(config: type[StageConfig] | None) -> str:
    """The hand-raised version of the stage a config configures ('TeacherSamplingSettings@1'; 'none@0' without
    config)."""
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
    made = {"config": dict(run_config), "profile": profile}
    if compute is None:
        return made
    return made | {
        "compute": {name: value for name, value in compute.items() if name not in ComputeSettings.SCHEDULING_ONLY}
    }


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
    return content_key if version == 1 else digest({"content": content_key, "stage_version": version}, 64)


def is_heavy(op: dg.OpDefinition) -> bool:
    """Whether an op runs a heavy stage (sampling, training, evaluation: the `device` pool's)."""
    return op.pool == DEVICE_POOL


def with_code_versions(definitions: dg.Definitions, every: dg.Definitions) -> dg.Definitions:
    """`definitions` with every asset's code version set (see the module docstring), computed over `every`: the
    graph with each asset some arm could run, so that a view that defines fewer (an experiment's own, `make view`)
    gives each asset it has the version the union view gives it. An asset that reads every arm's partitions (the
    verdict) covers its own stage alone: which arms and rounds it reads is the view's, not its code."""
    assets_defs = {key: assets_def for assets_def in every.assets for key in assets_def.keys}
    versions: dict[dg.AssetKey, str] = {}

    def version(key: dg.AssetKey) -> str:
        if key not in versions:
            assets_def = assets_defs[key]
            config = config_class(assets_def)
            parents = [
                parent
                for parent in assets_def.asset_deps[key]
                if assets_def.partitions_def is not None or assets_defs[parent].partitions_def is None
            ]
            made_of = {
                "stage": stage_version(config),
                "defaults": config().model_dump() if config is not None else {},
                "parents": sorted(version(parent) for parent in parents),
            }
            versions[key] = digest(made_of, 16)
        return versions[key]

    with (
        warnings.catch_warnings()
    ):  # a preview API of Dagster's: its warning would print on every load of the code location
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return definitions.map_asset_specs(func=lambda spec: spec.replace_attributes(code_version=version(spec.key)))


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
