"""`verifier_informative`'s rule: a verifier passes only when its validation AUROC's interval, resampling problems,
lies above 0.5."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from noisy_student_assets.core.training.verifier import auroc, auroc_interval, judged_auroc


def _scored(separation: float, problems: int = 24, samples: int = 4, seed: int = 0) -> pl.DataFrame:
    """Validation samples half right, each scored from a normal shifted by `separation` when right."""
    rng = np.random.default_rng(seed)
    correct = rng.random(problems * samples) < 0.5
    return pl.DataFrame(
        {
            "problem_id": [f"p{index // samples}" for index in range(problems * samples)],
            "correct": correct,
            "score": rng.normal(size=problems * samples) + separation * correct,
        }
    )


def test_a_verifier_that_ranks_right_samples_first_passes_with_its_interval_above_chance() -> None:
    scored = _scored(separation=2.0)
    low, high = auroc_interval(scored["score"], scored["correct"], scored["problem_id"])
    assert 0.5 < low <= auroc(scored["score"], scored["correct"]) <= high
    assert judged_auroc(scored)[1] is None


@pytest.mark.parametrize(("separation", "where"), [(0.0, "contains 0.5"), (-2.0, "lies below 0.5")])
def test_a_verifier_at_or_below_chance_fails_naming_its_interval(separation: float, where: str) -> None:
    failure = judged_auroc(_scored(separation))[1]
    assert failure is not None and where in failure and "interval" in failure


def test_a_lucky_auroc_on_few_problems_fails_as_its_interval_reaches_chance() -> None:
    """Every problem's samples share one score shift: what looks like ranking is a few problems' luck."""
    scored = pl.DataFrame(
        {
            "problem_id": ["a", "a", "b", "b", "c", "c"],
            "correct": [True, False, True, False, True, False],
            "score": [0.9, 0.1, 0.2, 0.8, 0.7, 0.3],
        }
    )
    assert auroc(scored["score"], scored["correct"]) > 0.5
    assert "contains 0.5" in judged_auroc(scored)[1]


def test_validation_samples_of_one_class_cannot_show_a_verifier_informative() -> None:
    scored = _scored(separation=2.0).with_columns(correct=pl.lit(True))
    assert auroc_interval(scored["score"], scored["correct"], scored["problem_id"]) is None
    assert "all right or all wrong" in judged_auroc(scored)[1]


def test_the_confidence_is_a_verifier_setting_left_out_of_its_fingerprint_at_its_default() -> None:
    """A verifier of few validation problems can be judged on its bootstrap median (`informative_confidence: 0`);
    a verifier made before the setting keeps its fingerprint and reuse key."""
    from noisy_student_assets.core.settings import VerifierSettings

    lucky = pl.DataFrame(
        {
            "problem_id": ["a", "a", "b", "b", "c", "c"],
            "correct": [True, False, True, False, True, False],
            "score": [0.9, 0.1, 0.2, 0.8, 0.7, 0.3],
        }
    )
    assert judged_auroc(lucky, confidence=0.0)[1] is None
    assert "informative_confidence" not in VerifierSettings(seed=0).model_dump()
    assert VerifierSettings(seed=0, informative_confidence=0.0).model_dump()["informative_confidence"] == 0.0
