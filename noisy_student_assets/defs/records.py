"""What the instance recorded of an asset partition: its latest materialization and what its checks judged. The
grid, the lineage and the next-round automation read it alike."""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg
from dagster._core.event_api import PartitionKeyFilter


def latest_materialization(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None):
    """The latest materialization record of one asset partition (of the asset, when `partition` is None), or None."""
    partitions = [partition] if partition else None
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=partitions), limit=1
    ).records
    return records[0] if records else None


def latest_check_evaluations(
    instance: dg.DagsterInstance, checks: Sequence[dg.AssetCheckKey], partition: str | None
) -> dict:
    """The evaluation of each check's latest execution in one partition (or of unpartitioned assets, when
    `partition` is None), for the checks that have one: not those never run, or only planned by a run that was
    killed before the check's step."""
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        checks, partition_filter=PartitionKeyFilter(key=partition)
    )
    return {
        check: record.event.dagster_event.event_specific_data
        for check, record in latest.items()
        if record.event and record.event.dagster_event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
    }


def latest_check_targets(
    instance: dg.DagsterInstance, checks: Sequence[dg.AssetCheckKey], partition: str | None
) -> dict[dg.AssetCheckKey, int | None]:
    """For each check of one partition (or of unpartitioned assets, when `partition` is None), the storage id
    of the materialization its latest evaluation judged; None where it has none."""
    evaluations = latest_check_evaluations(instance, checks, partition)
    targets = {
        check: evaluations[check].target_materialization_data if check in evaluations else None for check in checks
    }
    return {check: target.storage_id if target else None for check, target in targets.items()}


def check_outcomes_on(
    instance: dg.DagsterInstance,
    materialization,
    checks: Sequence[dg.AssetCheckKey],
    partition: str | None,
    run_evaluations: dict[str, list] | None = None,
) -> dict[dg.AssetCheckKey, bool]:
    """Whether each of `checks` passed on `materialization` (a record from `latest_materialization`), for those
    that judged it. Read from the evaluations that target it in its own run, then from each check's latest
    evaluation, which wins (a check step run again later): Dagster records a check yielded inside a partitioned
    asset without its partition, so only its materialization's run finds it. `run_evaluations` keeps each run's
    evaluations across calls (one run holds many assets' checks)."""
    cache = {} if run_evaluations is None else run_evaluations
    if materialization.run_id not in cache:
        events = instance.all_logs(materialization.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        cache[materialization.run_id] = [event.dagster_event.event_specific_data for event in events]
    passed: dict[dg.AssetCheckKey, bool] = {}
    for evaluation in [*cache[materialization.run_id], *latest_check_evaluations(instance, checks, partition).values()]:
        target = evaluation.target_materialization_data
        if evaluation.asset_check_key in checks and target and target.storage_id == materialization.storage_id:
            passed[evaluation.asset_check_key] = evaluation.passed
    return passed
