"""The next-round sensor against an instance whose arms stand at different rounds: stand-in assets with the
round's keys are materialized per arm, their `no_eval_regression` check yielded inside the eval report as the
real asset yields it (Dagster records such a check without its partition), without training anything."""

from __future__ import annotations

import dagster as dg

from noisy_student_assets.core import layout
from noisy_student_assets.definitions import defs
from noisy_student_assets.defs.checks import NO_EVAL_REGRESSION, no_eval_regression_spec
from noisy_student_assets.defs.partitions import ARMS, round_key
from noisy_student_assets.defs.sensors import NEXT_ROUND_TAG
from resources.experiments import ExperimentFiles
from tests.conftest import TEST_EXPERIMENTS


def _materialized(instance: dg.DagsterInstance, key: dg.AssetKey, arm: str) -> None:
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key, partition=arm))


def _round_done(instance: dg.DagsterInstance, number: int, arm: str, *, regressed: bool) -> None:
    report = round_key(number, layout.EVAL_REPORT)

    @dg.asset(key=round_key(number, layout.STUDENT), partitions_def=ARMS)
    def student() -> None:
        return None

    @dg.asset(key=report, partitions_def=ARMS, deps=[student], check_specs=[no_eval_regression_spec(report)])
    def eval_report():
        yield dg.MaterializeResult()
        yield dg.AssetCheckResult(check_name=NO_EVAL_REGRESSION, passed=not regressed, severity=dg.AssetCheckSeverity.WARN)

    assert dg.materialize([student, eval_report], instance=instance, partition_key=arm).success


def _requests(instance: dg.DagsterInstance) -> dict[str, dg.RunRequest]:
    sensor = defs.get_sensor_def("next_round_sensor")
    context = dg.build_sensor_context(
        instance=instance, resources={"experiments": ExperimentFiles(directory=str(TEST_EXPERIMENTS))}, definitions=defs
    )
    return {request.partition_key: request for request in sensor(context)}


def test_each_arm_is_offered_its_next_round_and_no_other() -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(ARMS.name, ["a", "b", "c", "g", "undeclared"])
        for arm in ("a", "b", "c"):
            _materialized(instance, dg.AssetKey(layout.LABELED_RL), arm)
            _materialized(instance, dg.AssetKey(layout.LABELED_RL_EVAL), arm)
        _round_done(instance, 1, "c", regressed=True)
        _round_done(instance, 1, "b", regressed=False)  # the latest evaluation of the check is now b's
        requests = _requests(instance)

        assert set(requests) == {"a", "b"}, "g has no labeled-RL eval, c's round 1 regressed, no file declares undeclared"
        assert requests["a"].job_name == "round_001_job" and requests["a"].tags[NEXT_ROUND_TAG] == "round_001"
        assert requests["b"].job_name == "round_002_job"
        selected = {key.to_user_string() for key in requests["b"].asset_selection}
        assert selected == set(layout.round_asset_names(2, layout.CONTROLS)), "the arm's experiment's controls, eval report last"
        teacher = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=round_key(1, layout.STUDENT), asset_partitions=["b"]), limit=1
        ).records[0]
        assert requests["b"].run_key == f"b:round_002:teacher-{teacher.storage_id}"

        _round_done(instance, 2, "b", regressed=False)
        assert "b" not in _requests(instance), "every round of b's experiment is done"
