"""The stopping rule (`progress.stop_reason`) that the next-round automation and the grid both apply, and the rule
of when a round is due (`staleness.round_not_due`)."""

import pytest

from noisy_student_assets.core.experiments.progress import stop_reason
from noisy_student_assets.core.settings import RoundsSettings
from noisy_student_assets.core.staleness import Latest, round_not_due


def test_without_a_patience_an_arm_runs_every_round_up_to_max_rounds() -> None:
    rule = RoundsSettings(max_rounds=3)
    assert [stop_reason(rule, done) for done in range(3)] == [None, None, None]
    assert stop_reason(rule, 3) == "max_rounds=3 reached"
    assert stop_reason(RoundsSettings(max_rounds=0), 0) == "max_rounds=0 reached"


def test_patience_1_stops_after_the_first_round_whose_validation_accuracy_did_not_improve() -> None:
    rule = RoundsSettings(max_rounds=10, patience=1)
    assert stop_reason(rule, 0, [0.30]) is None, "round 1 always runs"
    assert stop_reason(rule, 1, [0.30, 0.35]) is None
    assert stop_reason(rule, 2, [0.30, 0.35, 0.40]) is None
    reason = stop_reason(rule, 3, [0.30, 0.35, 0.40, 0.40])
    assert reason and "round 2's 0.400" in reason, "a tie is no improvement"
    assert stop_reason(rule, 1, [0.30, 0.25]), "worse than labeled RL (round 0)"


def test_a_longer_patience_forgives_rounds_that_did_not_improve_until_it_runs_out() -> None:
    rule = RoundsSettings(max_rounds=10, patience=2)
    assert stop_reason(rule, 1, [0.30, 0.29]) is None
    assert stop_reason(rule, 2, [0.30, 0.29, 0.31]) is None, "round 2 beat labeled RL's 0.30: the count starts again"
    assert stop_reason(rule, 3, [0.30, 0.29, 0.31, 0.20]) is None
    assert stop_reason(rule, 4, [0.30, 0.29, 0.31, 0.20, 0.31]), "two rounds without beating round 2's 0.31"


def test_an_improvement_counts_only_past_min_improvement() -> None:
    rule = RoundsSettings(max_rounds=10, patience=1, min_improvement=0.02)
    assert stop_reason(rule, 1, [0.30, 0.31]), "0.01 better is within min_improvement"
    assert stop_reason(rule, 1, [0.30, 0.33]) is None


def test_a_patience_needs_every_validation_accuracy_up_to_the_round() -> None:
    with pytest.raises(ValueError, match=r"rounds 1\.\.2"):
        stop_reason(RoundsSettings(max_rounds=5, patience=1), 2, [0.3, 0.4])


def test_a_round_is_due_once_everything_it_reads_is_current_and_the_stopping_rule_lets_it_run() -> None:
    rule = RoundsSettings(max_rounds=2)
    split, labeled_rl = Latest("split", 3), Latest("labeled_rl", 5, {"split": 3})
    assert round_not_due([split, labeled_rl], rule, 0, lambda: ()) is None
    assert round_not_due([Latest("split", None), labeled_rl], rule, 0, lambda: ()) == "split is not materialized"
    redone_split = Latest("labeled_rl", 5, {"split": 8})
    assert round_not_due([split, redone_split], rule, 0, lambda: ()) == (
        "labeled_rl was materialized before its input split (not redone since)"
    )
    failed = Latest("labeled_rl", 5, {"split": 3}, ("smoke_generation",))
    assert "blocking check smoke_generation did not pass" in round_not_due([split, failed], rule, 0, lambda: ())
    assert round_not_due([split, labeled_rl], rule, 2, lambda: ()) == "max_rounds=2 reached"
    patient = RoundsSettings(max_rounds=2, patience=1)
    not_recorded = "a validation eval its patience reads is not materialized"
    assert round_not_due([split], patient, 1, lambda: None) == not_recorded


def test_a_round_s_inputs_are_read_up_to_the_first_that_is_not_current() -> None:
    read = []

    def inputs():
        for latest in (Latest("split", None), Latest("labeled_rl", 5)):
            read.append(latest.name)
            yield latest

    def read_validation():
        read.append("validation")
        return ()

    assert round_not_due(inputs(), RoundsSettings(max_rounds=2), 0, read_validation) == "split is not materialized"
    assert read == ["split"], "the instance is not read further, nor the validation accuracies"
