"""The stopping rule of a GRPO run (no model: step logs written by hand): the answer reward's saturation, the
stalled-validation checks (`training/validation_stop.py`), and the reason a run records for where it ended."""

from __future__ import annotations

import pytest

from noisy_student_assets.core.settings import GRPOSettings
from noisy_student_assets.core.training import validation_stop
from noisy_student_assets.core.training.grpo import ANSWER_REWARD_LOGGED, saturation_step, stop_reason
from noisy_student_assets.core.training.validation_stop import (
    VALIDATION_LOGGED,
    Check,
    best_check,
    greedy_accuracy,
    logged_checks,
    stalled,
)


def _log(rewards: list[float], checks: dict[int, float] | None = None) -> list[dict]:
    """A GRPO run's step log: each step's answer reward, and the validation checks' accuracies at their steps."""
    return [
        {ANSWER_REWARD_LOGGED: reward, "step": step}
        | ({VALIDATION_LOGGED: checks[step]} if checks and step in checks else {})
        for step, reward in enumerate(rewards, start=1)
    ]


def test_a_run_s_stop_reason_is_its_rule_met_at_its_last_step_or_its_budget_spent() -> None:
    rule = GRPOSettings(max_steps=8, stop_reward=0.75, stop_window=2)
    assert saturation_step([0.5, 0.7, 0.8, 0.9], 0.75, 2) == 3
    assert stop_reason(_log([0.5, 0.7, 0.8]), rule, 3) == (
        "labels learned: the answer reward's 2-step mean reached 0.75 at step 3 of at most 8"
    )
    assert stop_reason(_log([0.5] * 8), rule, 8) == (
        "max_steps 8 reached, the stopping rule (0.75) not met (last 2-step mean 0.50)"
    )
    assert stop_reason(_log([0.5] * 8), GRPOSettings(max_steps=8), 8) == "max_steps 8 reached (last 4-step mean 0.50)"
    assert stop_reason([], GRPOSettings(max_steps=3), 3) == "max_steps 3 reached (no reward logged)"


def test_a_checked_run_s_stop_reason_says_whether_validation_stalled_and_which_step_it_kept() -> None:
    rule = GRPOSettings(max_steps=12, stop_reward=0.9, rollouts="vllm", validation_every=2, validation_patience=2)
    stalled_log = _log([0.5] * 6, {2: 0.30, 4: 0.40, 6: 0.40})
    assert stop_reason(stalled_log, rule, 6) == (
        "max_steps 12 reached, the stopping rule (0.9) not met (last 4-step mean 0.50); kept step 4's weights, the "
        "best of 3 checks"
    ), "one check without a higher accuracy is within a patience of 2"
    stalled_log = _log([0.5] * 8, {2: 0.30, 4: 0.40, 6: 0.40, 8: 0.35})
    assert stop_reason(stalled_log, rule, 8) == (
        "validation stalled: greedy accuracy 0.400 at step 4 not beaten in 2 checks, to step 8 of at most 12; kept "
        "step 4's weights, the best of 4 checks"
    ), "a check that only equals the best is no improvement"
    saturated_log = _log([0.5, 0.9, 1.0, 1.0, 1.0], {2: 0.30, 4: 0.50, 5: 0.45})
    assert stop_reason(saturated_log, rule, 5) == (
        "labels learned: the answer reward's 4-step mean reached 0.9 at step 5 of at most 12; kept step 4's weights, "
        "the best of 3 checks"
    )


def test_the_best_check_is_the_earliest_of_the_highest_and_a_stall_counts_the_checks_after_it() -> None:
    checks = logged_checks(_log([0.0] * 8, {2: 0.3, 4: 0.5, 6: 0.5, 8: 0.4}))
    assert [check.step for check in checks] == [2, 4, 6, 8]
    assert best_check(checks) == Check(4, 0.5)
    assert not stalled(checks, 3) and stalled(checks, 2)
    assert best_check([]) is None and not stalled([], 1)


def test_validation_accuracy_is_over_the_graded_answers(monkeypatch) -> None:
    completions = ["so \\boxed{12}", "\\boxed{7}", "no answer"]
    assert greedy_accuracy(completions, ["12", "8", "3"]) == pytest.approx(1 / 3), "no answer grades as wrong"
    graded = validation_stop.answers_equivalent
    monkeypatch.setattr(
        validation_stop, "answers_equivalent", lambda gold, answer: None if gold == "8" else graded(gold, answer)
    )
    assert greedy_accuracy(completions, ["12", "8", "3"]) == pytest.approx(1 / 2), "an ungraded answer is left out"
    assert greedy_accuracy(["\\boxed{7}"], ["8"]) == 0.0, "and none graded is none right"


def test_validation_stop_needs_the_run_s_vllm_engine() -> None:
    with pytest.raises(ValueError, match="needs rollouts vllm"):
        GRPOSettings(rollouts="trl", validation_every=8)


def test_a_checked_run_without_validation_problems_is_refused() -> None:
    import polars as pl

    with pytest.raises(ValueError, match="given no validation problems"):
        validation_stop.require_validation(8, None)
    validation_stop.require_validation(0, None)
    validation_stop.require_validation(8, pl.DataFrame({"problem_id": ["p0"], "gold_answer": ["2"]}))
