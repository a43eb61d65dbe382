"""Where a changed default shows in the UI, with its reason: the `made_with_current_defaults` check.

Dagster marks an asset whose code version changed (a default, a stage version, or an upstream's) as unsynced, but for
a partitioned asset only in its *Partitions* tab, and without saying which setting changed. This check, one per
asset with a code version and not partitioned (it judges every arm), says it where people look: on the asset's node
in the lineage and on its Overview, at WARN severity, its description naming each arm whose latest materialization
was made with other code, and why, as `grid plan` names settings ("arm g: default changed: config.k: 8 -> 6"; an
asset downstream: "arm g: upstream round_001/generations: default changed: ...").

Nothing runs after *Reload definitions*, so a sensor (`CURRENT_DEFAULTS_SENSOR`, running by default under the
daemon of `dagster dev`) judges every asset on each tick and reports the verdicts that changed as runless check
evaluations. The check also runs as a step where the UI includes it (materializing an asset, *Execute*). The grid
leaves it out: `grid plan` says the same from the run config the grid runs with."""

import functools
import json
from dataclasses import dataclass

import dagster as dg
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph

from noisy_student_assets.core import environment
from noisy_student_assets.core.staleness import own_code_changes
from noisy_student_assets.defs.lineage import (
    CODE_VERSION_TAG,
    DEFAULTS_KEY,
    STAGE_VERSION_KEY,
    config_class,
    stage_defaults,
)
from noisy_student_assets.defs.records import latest_materialization

CURRENT_DEFAULTS = "made_with_current_defaults"
CURRENT_DEFAULTS_SENSOR = "made_with_current_defaults_sensor"
SENSOR_INTERVAL_S = environment.defaults_check_interval_s()
"""Seconds between the sensor's evaluations (`environment.DEFAULTS_CHECK_INTERVAL_S`)."""
DESCRIPTION = (
    "Warns when an arm's latest materialization was made with other code than the code location's now (a changed "
    "default, stage version or upstream): which arms, and the setting with its two values. Reported by "
    f"{CURRENT_DEFAULTS_SENSOR} after a reload."
)


@dataclass(frozen=True)
class Verdict:
    """One asset's check outcome over every arm."""

    passed: bool
    description: str
    stale_arms: tuple[str, ...] = ()


def judge(instance: dg.DagsterInstance, graph) -> dict[dg.AssetKey, Verdict]:
    """Each materialized asset of `graph` (with code versions): whether every arm's latest materialization (the
    asset's, where it is not partitioned) has the asset's code version now, and if not, why."""
    causes: dict[tuple[dg.AssetKey, str | None], list[str]] = {}
    made: dict[tuple[dg.AssetKey, str | None], int] = {}  # the latest materialization's storage id
    for key in graph.toposorted_asset_keys:
        node = graph.get(key)
        partitions = sorted(instance.get_materialized_partitions(key)) if node.partitions_def else [None]
        stage, defaults = stage_defaults(config_class(node.assets_def))
        for partition in partitions:
            record = latest_materialization(instance, key, partition)
            if record is None:
                continue
            made[(key, partition)] = record.storage_id
            materialization = record.asset_materialization
            if node.code_version is None or materialization.tags.get(CODE_VERSION_TAG) == node.code_version:
                continue
            metadata = materialization.metadata
            own = own_code_changes(
                metadata[STAGE_VERSION_KEY].value if STAGE_VERSION_KEY in metadata else None,
                metadata[DEFAULTS_KEY].value if DEFAULTS_KEY in metadata else None,
                stage,
                defaults,
            )
            parents = sorted(
                (parent, partition if graph.get(parent).partitions_def else None) for parent in node.parent_keys
            )
            upstream = [
                cause if cause.startswith("upstream ") else f"upstream {parent.to_user_string()}: {cause}"
                for parent, parent_partition in parents
                for cause in causes.get((parent, parent_partition), [])
            ]
            remade = [
                f"upstream {parent.to_user_string()} materialized again since"
                for parent, parent_partition in parents
                if made.get((parent, parent_partition), -1) > record.storage_id
            ]
            causes[(key, partition)] = own or list(dict.fromkeys(upstream)) or remade or ["an input's code changed"]
    judged: dict[dg.AssetKey, list[tuple[str | None, list[str] | None]]] = {}
    for key, partition in made:
        judged.setdefault(key, []).append((partition, causes.get((key, partition))))
    return {key: _verdict(partitions) for key, partitions in judged.items()}


def _verdict(partitions: list[tuple[str | None, list[str] | None]]) -> Verdict:
    stale = [(partition, reasons) for partition, reasons in partitions if reasons]
    if not stale:
        return Verdict(True, "made with the current defaults" + (" in every arm" if partitions[0][0] else ""))
    lines = [f"{f'arm {partition}: ' if partition else ''}{'; '.join(reasons)}" for partition, reasons in stale]
    return Verdict(False, "\n".join(lines), tuple(partition for partition, _ in stale if partition))


def _outcome(verdict: Verdict) -> dict:
    """What a check result and a runless check evaluation of `verdict` say alike."""
    return {
        "check_name": CURRENT_DEFAULTS,
        "passed": verdict.passed,
        "severity": dg.AssetCheckSeverity.WARN,
        "description": verdict.description,
        "metadata": {"stale_arms": dg.MetadataValue.json(list(verdict.stale_arms))},
    }


def current_defaults(assets: dg.Definitions) -> dg.Definitions:
    """The check on every asset of `assets` and the sensor that reports it after a reload; both judge the graph of
    `assets` (the code location's assets, with their code versions)."""

    @functools.cache
    def graph() -> AssetGraph:
        """Built once, on first use: the code location's resources are not the graph's to validate."""
        return AssetGraph.from_assets(list(assets.assets))

    keys = [
        key
        for assets_def in assets.assets
        for key, version in assets_def.code_versions_by_key.items()
        if version is not None
    ]

    @dg.multi_asset_check(
        name=CURRENT_DEFAULTS,
        specs=[dg.AssetCheckSpec(CURRENT_DEFAULTS, asset=key, description=DESCRIPTION) for key in keys],
        can_subset=True,
    )
    def made_with_current_defaults(context: dg.AssetCheckExecutionContext):
        verdicts = judge(context.instance, graph())
        for check in context.selected_asset_check_keys:
            verdict = verdicts.get(check.asset_key, Verdict(True, "not materialized"))
            yield dg.AssetCheckResult(asset_key=check.asset_key, **_outcome(verdict))

    @dg.sensor(
        name=CURRENT_DEFAULTS_SENSOR,
        minimum_interval_seconds=SENSOR_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Reports {CURRENT_DEFAULTS} of every materialized asset whose verdict changed: after a reload "
        "that changed a default, the assets it affects show a warning on the lineage, naming the setting.",
    )
    def made_with_current_defaults_sensor(context: dg.SensorEvaluationContext):
        reported = json.loads(context.cursor) if context.cursor else {}
        verdicts = judge(context.instance, graph())
        changed = 0
        for key, verdict in verdicts.items():
            state = [verdict.passed, verdict.description]
            if reported.get(key.to_user_string()) != state:
                context.instance.report_runless_asset_event(dg.AssetCheckEvaluation(asset_key=key, **_outcome(verdict)))
                reported[key.to_user_string()] = state
                changed += 1
        context.update_cursor(json.dumps(reported))
        return dg.SkipReason(f"{changed} verdicts reported, {len(verdicts)} assets judged")

    return dg.Definitions(asset_checks=[made_with_current_defaults], sensors=[made_with_current_defaults_sensor])
