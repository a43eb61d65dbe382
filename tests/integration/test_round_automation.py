"""The next-round automation (`defs/automation.py`) evaluated by Dagster itself (`evaluate_automation_conditions`,
tick after tick with its cursor) against an instance whose arms stand at different rounds. Stand-in assets with the
real keys and the real blocking checks' names are materialized per arm, without training anything: the round
conditions read only what the instance recorded (materializations, check evaluations, validation accuracy)."""

from __future__ import annotations

from collections import Counter

import dagster as dg
import pytest

from noisy_student_assets.core.experiments.arms import load_experiments
from noisy_student_assets.core.experiments.progress import pre_round_assets, round_assets
from noisy_student_assets.definitions import defs
from noisy_student_assets.defs.partitions import ARMS
from tests.conftest import TEST_EXPERIMENTS
from tests.stand_ins import GRAPH, record

EXPERIMENT = load_experiments(TEST_EXPERIMENTS)["automation"]


def _ready_for_round_1(instance: dg.DagsterInstance, arm: str, validation: float | None = None) -> None:
    record(instance, pre_round_assets(EXPERIMENT, EXPERIMENT.arm(arm)), arm, validation=validation)


def _round(instance: dg.DagsterInstance, number: int, arm: str, **kwargs) -> None:
    record(instance, round_assets(number, EXPERIMENT, EXPERIMENT.arm(arm)), arm, **kwargs)


class Ticks:
    """Successive evaluations of every round asset's condition, as the sensor's ticks (one cursor)."""

    def __init__(self, instance: dg.DagsterInstance) -> None:
        self.instance, self.cursor = instance, None

    def __call__(self) -> dict[str, set[str]]:
        """Per arm, the round assets requested on this tick."""
        result = dg.evaluate_automation_conditions(defs=defs, instance=self.instance, cursor=self.cursor)
        self.cursor = result.cursor
        requested: dict[str, set[str]] = {}
        for key in GRAPH.get_all_asset_keys():
            for arm in result.get_requested_partitions(key) if GRAPH.get(key).automation_condition else ():
                requested.setdefault(arm, set()).add(key.to_user_string())
        return requested


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(ARMS.name, ["auto", "patient", "undeclared"])
        yield instance


def test_round_3_is_launched_by_itself_when_round_2s_checks_pass(instance: dg.DagsterInstance) -> None:
    tick = Ticks(instance)
    _ready_for_round_1(instance, "auto")
    assert tick() == {"auto": set(round_assets(1, EXPERIMENT, EXPERIMENT.arm("auto")))}, (
        "round 1 once labeled RL is evaluated"
    )
    assert tick() == {}, "requested once: a failed round is not retried in a loop"

    _round(instance, 1, "auto")
    _round(instance, 2, "auto", failing="smoke_generation")
    assert tick() == {}, "round 2's student failed a blocking check"

    _round(instance, 2, "auto")
    requested = tick()
    assert requested == {"auto": set(round_assets(3, EXPERIMENT, EXPERIMENT.arm("auto")))}, (
        "round 3, one request of every asset the arm's experiment lists"
    )
    assert "round_003/gold_label_checkpoint" not in requested["auto"], "a control the experiment does not run"
    assert tick() == {}

    _round(instance, 3, "auto")
    assert tick() == {}, "max_rounds=3 reached"


def test_a_retrained_teacher_starts_its_round_anew(instance: dg.DagsterInstance) -> None:
    tick = Ticks(instance)
    tick()
    _ready_for_round_1(instance, "auto")
    _round(instance, 1, "auto")
    assert tick() == {"auto": set(round_assets(2, EXPERIMENT, EXPERIMENT.arm("auto")))}
    _round(instance, 2, "auto", failing="eval_not_degenerate")  # the round stops at its eval report
    assert tick() == {}

    record(instance, ["round_001/student_checkpoint"], "auto")
    assert tick() == {}, (
        "round 1's evals are older than its retrained student: round 1 is not complete until they are redone"
    )
    _round(instance, 1, "auto")
    assert tick() == {"auto": set(round_assets(2, EXPERIMENT, EXPERIMENT.arm("auto")))}, (
        "round 2 again, from the new teacher"
    )


def test_an_arm_with_patience_1_stops_after_the_first_round_whose_validation_accuracy_did_not_improve(
    instance: dg.DagsterInstance,
) -> None:
    tick = Ticks(instance)
    arm = EXPERIMENT.arm("patient")
    assert "labeled_rl_validation" in pre_round_assets(EXPERIMENT, arm)
    assert "round_001/student_validation" in round_assets(1, EXPERIMENT, arm)
    _ready_for_round_1(instance, "patient", validation=0.30)
    _round(instance, 1, "patient", validation=0.35)
    assert tick() == {"patient": set(round_assets(2, EXPERIMENT, arm))}, "round 1 improved on labeled RL's 0.30"
    _round(instance, 2, "patient", validation=0.35)
    assert tick() == {}, "round 2 did not improve on 0.35: patience 1 stops the arm"
    assert tick() == {}


def test_a_tick_reads_each_experiment_file_once_and_judges_each_arm_s_round_once(
    instance: dg.DagsterInstance, monkeypatch
) -> None:
    from noisy_student_assets.core.experiments import arms
    from noisy_student_assets.defs import automation

    reads, judged = Counter(), Counter()
    load_experiment, why_not_due = arms.load_experiment, automation.why_not_due

    def counted_load(path):
        reads[path.name] += 1
        return load_experiment(path)

    def counted_judgement(instance, graph, experiment, arm, number, run_evaluations):
        judged[arm.name, number] += 1
        return why_not_due(instance, graph, experiment, arm, number, run_evaluations)

    monkeypatch.setattr(arms, "load_experiment", counted_load)
    monkeypatch.setattr(automation, "why_not_due", counted_judgement)
    tick = Ticks(instance)
    _ready_for_round_1(instance, "auto")
    _ready_for_round_1(instance, "patient", validation=0.30)
    files = sorted(path.name for path in TEST_EXPERIMENTS.glob("*.yaml"))
    for _ in range(2):
        reads.clear(), judged.clear()
        tick()
        assert sorted(reads) == files and set(reads.values()) == {1}, "each experiment file read once per tick"
        rounds = {number for _, number in judged}
        assert judged and set(judged.values()) == {1}, "each arm's round judged once for all of the round's assets"
        assert set(judged) == {(arm, number) for arm in ("auto", "patient") for number in rounds}
