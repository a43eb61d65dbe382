"""The `made_with_current_defaults` check and its sensor: which assets a changed default left behind, in every arm,
with the setting's two values, as materializations recorded by older code say (runless events stand in for them)."""

from __future__ import annotations

import dagster as dg
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.staleness import own_code_changes
from noisy_student_assets.defs.code_location import defs
from noisy_student_assets.defs.current_defaults import CURRENT_DEFAULTS, CURRENT_DEFAULTS_SENSOR, judge
from noisy_student_assets.defs.lineage import (
    CODE_VERSION_TAG,
    DEFAULTS_KEY,
    STAGE_VERSION_KEY,
    config_class,
    stage_defaults,
)
from noisy_student_assets.defs.partitions import ARMS
from noisy_student_assets.defs.records import latest_check_evaluations

GENERATIONS = dg.AssetKey(layout.round_asset(1, layout.GENERATIONS))
PSEUDO_LABELS = dg.AssetKey(layout.round_asset(1, layout.PSEUDO_LABELS))
LABELED_RL = dg.AssetKey(layout.LABELED_RL)


def test_what_changed_of_an_asset_s_own_code_is_named_with_both_values() -> None:
    assert own_code_changes("S@1", {"k": 6, "tau": 0.5}, "S@1", {"k": 8, "tau": 0.5}) == [
        "default changed: config.k: 6 -> 8"
    ]
    assert own_code_changes("S@1", {"k": 8}, "S@2", {"k": 8}) == ["stage version S@1 -> S@2"]
    assert own_code_changes(None, None, "S@1", {"k": 8}) == ["made before its defaults were recorded"]
    assert own_code_changes("none@0", None, "none@0", {}) == []


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(ARMS.name, ["a", "b"])
        yield instance


def _record(instance, key: dg.AssetKey, partition: str, code_version: str | None = None, **changed_defaults) -> None:
    """A materialization of `key` in `partition` as code of `code_version` (default: the current one) with these
    defaults changed would have recorded it."""
    node = defs.resolve_asset_graph().get(key)
    stage, defaults = stage_defaults(config_class(node.assets_def))
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key=key,
            partition=partition,
            tags={CODE_VERSION_TAG: code_version or node.code_version},
            metadata={STAGE_VERSION_KEY: stage, DEFAULTS_KEY: dg.MetadataValue.json(defaults | changed_defaults)},
        )
    )


def test_a_changed_default_marks_its_asset_and_what_reads_it_in_the_arms_made_before(instance) -> None:
    current_k = stage_defaults(config_class(defs.resolve_asset_graph().get(GENERATIONS).assets_def))[1]["k"]
    _record(instance, GENERATIONS, "a", code_version="older", k=current_k + 2)
    _record(instance, GENERATIONS, "b")
    _record(instance, PSEUDO_LABELS, "a", code_version="older")
    _record(instance, LABELED_RL, "a")

    verdicts = judge(instance, defs.resolve_asset_graph())

    changed = f"default changed: config.k: {current_k + 2} -> {current_k}"
    assert not verdicts[GENERATIONS].passed
    assert verdicts[GENERATIONS].description == f"arm a: {changed}"
    assert verdicts[GENERATIONS].stale_arms == ("a",)
    assert verdicts[PSEUDO_LABELS].description == f"arm a: upstream {GENERATIONS.to_user_string()}: {changed}"
    assert verdicts[LABELED_RL].passed and verdicts[LABELED_RL].description.endswith("in every arm")
    assert set(verdicts) == {GENERATIONS, PSEUDO_LABELS, LABELED_RL}, "only what was materialized is judged"

    _record(instance, GENERATIONS, "a")  # remade with the current defaults: what read the old one is still behind
    verdicts = judge(instance, defs.resolve_asset_graph())
    assert verdicts[GENERATIONS].passed
    remade = f"arm a: upstream {GENERATIONS.to_user_string()} materialized again since"
    assert verdicts[PSEUDO_LABELS].description == remade


def test_the_sensor_reports_each_verdict_once_and_again_when_it_changes(instance) -> None:
    sensor = next(sensor for sensor in defs.sensors if sensor.name == CURRENT_DEFAULTS_SENSOR)
    check = dg.AssetCheckKey(GENERATIONS, CURRENT_DEFAULTS)
    _record(instance, GENERATIONS, "a", code_version="older", k=3)

    def tick(cursor: str | None):
        context = dg.build_sensor_context(instance=instance, cursor=cursor)
        result = sensor(context)
        return context.cursor, result

    cursor, result = tick(None)
    assert result.skip_message.startswith("1 verdicts reported")
    evaluation = latest_check_evaluations(instance, [check], None)[check]
    assert not evaluation.passed and "config.k: 3 -> " in evaluation.description
    assert evaluation.severity == dg.AssetCheckSeverity.WARN

    cursor, result = tick(cursor)
    assert result.skip_message.startswith("0 verdicts reported"), "an unchanged verdict is not reported again"

    _record(instance, GENERATIONS, "a")
    cursor, result = tick(cursor)
    assert result.skip_message.startswith("1 verdicts reported")
    assert latest_check_evaluations(instance, [check], None)[check].passed
