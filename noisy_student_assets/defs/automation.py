"""Rounds that launch themselves, through declarative automation, while they help.

Every asset of round N carries `round_condition(N)`: requested for an arm once everything the round reads is
there (round N-1 complete: each of its assets materialized after its inputs' latest materializations, each blocking
check passed on its latest materialization; round 1: the arm's labeled RL and its evaluations) and the arm's
stopping rule lets round N run (`core/experiments/progress.py`: `max_rounds`, a patience on validation accuracy).
All of a round's assets become due in the same evaluation, so the sensor launches them as one run per arm. A round
is requested once per teacher: a failed round is not retried in a loop, and a re-trained teacher starts it anew.
Only the assets the arm's experiment file lists are requested (its controls; the validation eval where a patience
reads it).

Whether a round is due is `core/staleness.py`'s rule (`round_not_due`), on what the instance recorded. One tick
reads the experiment files once, and judges each arm's round once for all the round's assets (`_Tick`).

`next_round_automation` evaluates the conditions (*Automation*; off by default, as the grid drives rounds itself).
It replaces the `next_round_sensor` that did this before with one difference, on purpose: that sensor stopped an
arm whose held-out accuracy regressed, which chose on the held-out set; the stopping rule reads validation only.
"""

from __future__ import annotations

import warnings
from functools import partial

import dagster as dg

from noisy_student_assets.core import layout, staleness
from noisy_student_assets.core.experiments.arms import Arm, Experiment, load_experiments
from noisy_student_assets.core.experiments.directory import default_experiments_dir
from noisy_student_assets.core.experiments.progress import (
    pre_round_assets,
    round_assets,
    stop_reason,
    validation_assets,
)
from noisy_student_assets.defs.jobs import RUN_TAGS
from noisy_student_assets.defs.partitions import teacher_source_key
from noisy_student_assets.defs.records import check_outcomes_on, latest_materialization

NEXT_ROUND_AUTOMATION = "next_round_automation"


def _key(name: str) -> dg.AssetKey:
    return dg.AssetKey(name.split("/"))


def _latest(instance: dg.DagsterInstance, graph, key: dg.AssetKey, arm: str):
    return latest_materialization(instance, key, arm if graph.get(key).partitions_def else None)


def _is_round_asset(key: dg.AssetKey) -> bool:
    return len(key.path) > 1 and key.path[0].startswith(layout.ROUND_PREFIX)


def validation_accuracies(instance: dg.DagsterInstance, arm: str, done: int) -> list[float] | None:
    """Greedy validation accuracy of labeled RL and of rounds 1..`done`'s students of `arm`, as their materializations
    recorded it; None while one is missing."""
    records = [latest_materialization(instance, _key(name), arm) for name in validation_assets(done)]
    if any(record is None for record in records):
        return None
    return [record.asset_materialization.metadata["greedy_accuracy"].value for record in records]


def why_not_due(
    instance: dg.DagsterInstance, graph, experiment, arm: Arm, number: int, run_evaluations: dict | None = None
) -> str | None:
    """Why round `number` of `arm` is not due now, or None when it is (`staleness.round_not_due`)."""
    before = pre_round_assets(experiment, arm) if number == 1 else round_assets(number - 1, experiment, arm)
    latest = (_latest_state(instance, graph, name, arm.name, run_evaluations) for name in before)
    validation = partial(_rule_inputs, instance, arm, number - 1)  # read only once the round's inputs are current
    return staleness.round_not_due(latest, arm.stopping_rule, number - 1, validation)


def _latest_state(
    instance: dg.DagsterInstance, graph, name: str, arm: str, run_evaluations: dict | None
) -> staleness.Latest:
    """What the instance recorded of asset `name`'s latest materialization for `arm`, as `staleness.not_current`
    judges it."""
    node = graph.get(_key(name))
    record = _latest(instance, graph, node.key, arm)
    if record is None:
        return staleness.Latest(name, None)
    inputs = {
        parent.to_user_string(): parent_record.storage_id
        for parent in node.parent_keys
        if (parent_record := _latest(instance, graph, parent, arm))
    }
    blocking = [check for check in node.check_keys if graph.get_check_spec(check).blocking]
    passed = check_outcomes_on(instance, record, blocking, arm, run_evaluations)
    failed = tuple(check.name for check in blocking if not passed.get(check))
    return staleness.Latest(name, record.storage_id, inputs, failed)


def stopped(instance: dg.DagsterInstance, arm: Arm, done: int) -> str | None:
    """Why `arm` runs no round after round `done` (`progress.stop_reason`, on the validation accuracy the instance
    recorded), or None: the next round may run, or a validation eval the rule reads is not recorded yet."""
    validation = _rule_inputs(instance, arm, done)
    return None if validation is None else stop_reason(arm.stopping_rule, done, validation)


def _rule_inputs(instance: dg.DagsterInstance, arm: Arm, done: int) -> list[float] | tuple | None:
    """The validation accuracies `arm`'s stopping rule reads after round `done`: none without a patience, None while
    one is not recorded."""
    return validation_accuracies(instance, arm.name, done) if arm.stopping_rule.patience is not None else ()


class RoundDue(dg.AutomationCondition):
    """True for the arms whose round `number` is due (`why_not_due`) and whose experiment lists this asset."""

    def __init__(self, number: int) -> None:
        self.number = number

    @property
    def name(self) -> str:
        return f"{layout.round_prefix(self.number)}_due"

    @property
    def description(self) -> str:
        return (
            f"round {self.number - 1} complete with its blocking checks passed, and the arm's stopping rule lets round "
            f"{self.number} run"
        )

    def evaluate(self, context: dg.AutomationContext) -> dg.AutomationResult:
        tick = _TICKS.of(context)
        name, due = context.key.to_user_string(), set()
        for partition in context.candidate_subset.expensively_compute_partition_keys():
            experiment = tick.experiments.get(partition)
            if experiment is None:
                continue
            arm = experiment.arm(partition)
            if name in round_assets(self.number, experiment, arm) and tick.due(arm, self.number):
                due.add(partition)
        return dg.AutomationResult(context, context.candidate_subset.compute_intersection_with_partition_keys(due))


class _Tick:
    """What one evaluation of the round conditions (one tick of the sensor) reads once for all the assets it judges:
    the experiment files, and whether each arm's round is due (every asset of a round asks the same question)."""

    def __init__(self, context: dg.AutomationContext) -> None:
        self.view = context.asset_graph_view
        """The tick's view of the instance: Dagster makes one per evaluation."""
        self.instance, self.graph = context.asset_graph_view.instance, context.asset_graph
        self.experiments: dict[str, Experiment] = {
            name: experiment
            for experiment in load_experiments(default_experiments_dir()).values()
            for name in experiment.arms
        }
        """Each arm's experiment, by arm name."""
        self.run_evaluations: dict = {}
        self._due: dict[tuple[str, int], bool] = {}

    def due(self, arm: Arm, number: int) -> bool:
        if (arm.name, number) not in self._due:
            experiment = self.experiments[arm.name]
            reason = why_not_due(self.instance, self.graph, experiment, arm, number, self.run_evaluations)
            self._due[arm.name, number] = reason is None
        return self._due[arm.name, number]


class _TickCache:
    """The current tick's `_Tick`: a new one once Dagster evaluates with another view of the instance."""

    def __init__(self) -> None:
        self.tick: _Tick | None = None

    def of(self, context: dg.AutomationContext) -> _Tick:
        tick = self.tick
        if tick is None or tick.view is not context.asset_graph_view:
            tick = self.tick = _Tick(context)
        return tick


_TICKS = _TickCache()


def round_condition(number: int) -> dg.AutomationCondition:
    """Round `number`'s assets' condition: due, not in progress, and not requested since the round became due for
    a missing asset or its teacher was updated."""
    due = RoundDue(number)
    handled = (dg.AutomationCondition.newly_requested() | dg.AutomationCondition.newly_updated()).with_label("handled")
    triggered = (
        (due & dg.AutomationCondition.missing()).newly_true()
        | dg.AutomationCondition.asset_matches(teacher_source_key(number), dg.AutomationCondition.newly_updated())
    ).with_label("became due, or what its teacher follows from was updated")
    return (due & ~dg.AutomationCondition.in_progress() & triggered.since(handled)).with_label(
        f"round {number}, when due"
    )


def with_round_automation(definitions: dg.Definitions) -> dg.Definitions:
    """`definitions` with `round_condition` on every round asset (an asset keyed under a round prefix)."""

    def automated(spec: dg.AssetSpec) -> dg.AssetSpec:
        if not _is_round_asset(spec.key):
            return spec
        return spec.replace_attributes(automation_condition=round_condition(layout.round_number(spec.key.path[0])))

    with (
        warnings.catch_warnings()
    ):  # a preview API of Dagster's: its warning would print on every load of the code location
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return definitions.map_asset_specs(func=automated)


def next_round_automation(assets: dg.Definitions) -> dg.Definitions:
    """The sensor that evaluates the round assets' conditions, over the round assets of `assets` (none: no sensor)."""
    round_keys = [key for assets_def in assets.assets for key in assets_def.keys if _is_round_asset(key)]
    if not round_keys:
        return dg.Definitions()
    with warnings.catch_warnings():  # beta: `use_user_code_server`, which conditions written in Python need
        warnings.simplefilter("ignore", dg.BetaWarning)
        sensor = dg.AutomationConditionSensorDefinition(
            NEXT_ROUND_AUTOMATION,
            target=dg.AssetSelection.assets(*round_keys),
            run_tags=RUN_TAGS,
            minimum_interval_seconds=60,
            default_status=dg.DefaultSensorStatus.STOPPED,
            use_user_code_server=True,  # the round conditions are Python of this code location's
            emit_backfills=False,  # a run per arm and round, as the grid's
            description="Launches each arm's next round once the previous one is complete and its stopping rule "
            "lets it run.",
        )
    return dg.Definitions(sensors=[sensor])
