from noisy_student_assets.core.experiments.progress import RoundState, next_round

DONE, MISSING, REGRESSED = RoundState(evaluated=True), RoundState(evaluated=False), RoundState(evaluated=True, regressed=True)


def test_round_one_waits_for_the_labeled_rl_eval() -> None:
    assert next_round(False, [MISSING, MISSING], planned=2) is None
    assert next_round(True, [MISSING, MISSING], planned=2) == 1


def test_the_first_missing_round_is_next() -> None:
    assert next_round(True, [DONE, MISSING, MISSING], planned=3) == 2
    assert next_round(True, [DONE, DONE, MISSING], planned=3) == 3


def test_no_round_after_a_regression() -> None:
    assert next_round(True, [REGRESSED, MISSING], planned=2) is None
    assert next_round(True, [DONE, REGRESSED, MISSING], planned=3) is None
    # A regression further back does not hold up a round whose own teacher held its ground.
    assert next_round(True, [REGRESSED, DONE, MISSING], planned=3) == 3


def test_nothing_past_the_experiments_rounds() -> None:
    assert next_round(True, [DONE, MISSING, MISSING], planned=1) is None
    assert next_round(True, [DONE, DONE], planned=2) is None
