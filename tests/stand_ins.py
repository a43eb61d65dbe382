"""Stand-ins of the code location's assets: materializations with the real keys, partitions and blocking checks,
recorded without training anything, for tests of what reads the instance (the next-round automation)."""

from __future__ import annotations

import dagster as dg

from noisy_student_assets.core import layout
from noisy_student_assets.definitions import defs
from noisy_student_assets.defs.partitions import ARMS

GRAPH = defs.resolve_asset_graph()


def stand_in(
    key: dg.AssetKey, batch: set[dg.AssetKey], failing: str | None, validation: float | None
) -> dg.AssetsDefinition:
    checks = [check.name for check in GRAPH.get(key).check_keys if GRAPH.get_check_spec(check).blocking]
    inputs = [parent for parent in GRAPH.get(key).parent_keys if parent in batch]  # so that they run in the real order
    validated = key.path[-1] in (layout.LABELED_RL_VALIDATION, layout.STUDENT_VALIDATION)

    @dg.asset(
        key=key, partitions_def=ARMS, deps=inputs, check_specs=[dg.AssetCheckSpec(check, asset=key) for check in checks]
    )
    def _asset():
        yield dg.MaterializeResult(metadata={"greedy_accuracy": validation} if validated else None)
        for check in checks:
            yield dg.AssetCheckResult(check_name=check, passed=check != failing)

    return _asset


def record(
    instance: dg.DagsterInstance,
    names: list[str],
    arm: str,
    *,
    failing: str | None = None,
    validation: float | None = None,
) -> None:
    """Materialize stand-ins of `names` for `arm`, each blocking check passed (`failing`: that check failed), and
    a validation eval recording `validation` as its greedy accuracy."""
    keys = {dg.AssetKey(name.split("/")) for name in names}
    stand_ins = [stand_in(dg.AssetKey(name.split("/")), keys, failing, validation) for name in names]
    assert dg.materialize(stand_ins, instance=instance, partition_key=arm).success
