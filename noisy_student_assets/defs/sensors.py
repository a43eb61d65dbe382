"""`next_round_sensor`: offers each arm its next round, so that continuing an experiment from the UI is
one switch (Automation -> next_round_sensor -> on) instead of picking round jobs and partitions by hand.

Every minute it looks at each registered arm and requests the round `round_progress.next_round` names: round
1 once labeled RL is evaluated, round N once round N-1's eval report exists and its `no_eval_regression`
check passed. The run materializes the round's assets that the arm's experiment file lists (its controls,
not every control the code location defines). The run key names the teacher's materialization, so a round
is requested once per teacher: a failed round is not retried in a loop, and a re-trained teacher starts it
anew. Off by default: the grid (`make run`, `make grid`) drives rounds itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg
from dagster._core.event_api import PartitionKeyFilter

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import load_experiments
from noisy_student_assets.core.experiments.progress import RoundState, next_round
from noisy_student_assets.defs.checks import NO_EVAL_REGRESSION
from noisy_student_assets.defs.partitions import ARMS, round_key, teacher_key
from resources.experiments import ExperimentFiles

NEXT_ROUND_TAG = "noisy_student/next_round"


def latest_materialization(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None):
    """The latest materialization record of one asset partition (of the asset, when `partition` is None), or None."""
    partitions = [partition] if partition else None
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=partitions), limit=1).records
    return records[0] if records else None


def latest_check_evaluations(instance: dg.DagsterInstance, checks: Sequence[dg.AssetCheckKey], partition: str | None) -> dict:
    """The evaluation of each check's latest execution in one partition (or of unpartitioned assets, when
    `partition` is None), for the checks that have one: not those never run, or only planned by a run that was
    killed before the check's step."""
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(checks, partition_filter=PartitionKeyFilter(key=partition))
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
    targets = {check: evaluations[check].target_materialization_data if check in evaluations else None for check in checks}
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


def _round_state(instance: dg.DagsterInstance, number: int, arm: str) -> RoundState:
    report = round_key(number, layout.EVAL_REPORT)
    check = dg.AssetCheckKey(report, NO_EVAL_REGRESSION)
    materialization = latest_materialization(instance, report, arm)
    passed = check_outcomes_on(instance, materialization, [check], arm) if materialization else {}
    return RoundState(evaluated=materialization is not None, regressed=passed.get(check) is False)


def build_next_round_sensor(round_jobs: Sequence[dg.UnresolvedAssetJobDefinition]) -> dg.SensorDefinition:
    """The sensor over `round_jobs` (round N's job at index N - 1)."""

    @dg.sensor(
        name="next_round_sensor",
        jobs=list(round_jobs),
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Requests each arm's next round once the previous one is evaluated and did not regress.",
    )
    def next_round_sensor(context: dg.SensorEvaluationContext, experiments: ExperimentFiles):
        instance = context.instance
        by_arm = {arm: experiment for experiment in load_experiments(experiments.path).values() for arm in experiment.arms}
        for arm in instance.get_dynamic_partitions(ARMS.name):
            experiment = by_arm.get(arm)
            if experiment is None:
                context.log.warning(f"arm {arm} is registered but declared in no experiment file: skipped")
                continue
            states = [_round_state(instance, number, arm) for number in range(1, len(round_jobs) + 1)]
            labeled_rl_evaluated = latest_materialization(instance, dg.AssetKey(layout.LABELED_RL_EVAL), arm) is not None
            number = next_round(labeled_rl_evaluated, states, planned=min(experiment.rounds, len(round_jobs)))
            teacher = latest_materialization(instance, teacher_key(number), arm) if number else None
            if teacher is None:
                continue
            round_name = layout.round_prefix(number)
            yield dg.RunRequest(
                run_key=f"{arm}:{round_name}:teacher-{teacher.storage_id}",
                job_name=round_jobs[number - 1].name,
                partition_key=arm,
                asset_selection=[dg.AssetKey(name.split("/")) for name in layout.round_asset_names(number, experiment.controls)],
                tags={NEXT_ROUND_TAG: round_name},
            )

    return next_round_sensor
