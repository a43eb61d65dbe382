"""The guards against broken models without a model: the step guard on a hand-made step, the non-finite weight
scan, and the degenerate-output verdicts (tests/model/test_guards_in_grpo.py poisons real TRL GRPO runs)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
import torch
from safetensors.torch import save_file

from noisy_student_assets.core.training.guards import (
    NonFiniteWeightsError,
    assert_finite_checkpoint,
    degenerate_output_failure,
    non_finite_tensors,
    output_health,
    smoke_failure,
    step_guard_callback,
)


def test_a_non_finite_loss_skips_the_step_even_with_finite_gradients():
    layer = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(layer.parameters())
    layer(torch.ones(1, 2)).sum().backward()
    before = [p.detach().clone() for p in layer.parameters()]
    guard = step_guard_callback(3)
    args, state, control = (
        SimpleNamespace(output_dir="unused"),
        SimpleNamespace(global_step=0),
        SimpleNamespace(should_save=True),
    )
    guard.on_step_begin(args, state, control)
    guard.observe_loss(torch.tensor(math.inf))
    guard.on_pre_optimizer_step(args, state, control, model=layer, optimizer=optimizer)
    optimizer.step()
    assert guard.state.skipped_steps == [1]
    assert all(torch.equal(b, p) for b, p in zip(before, layer.parameters(), strict=True))
    assert guard.on_step_end(args, state, control).should_save is False


# --- non-finite weights ---------------------------------------------------------------------------


def test_non_finite_tensors_names_each_broken_tensor(tmp_path: Path):
    save_file(
        {"fine": torch.ones(3), "nan": torch.tensor([1.0, math.nan]), "inf": torch.tensor([-math.inf])},
        tmp_path / "model.safetensors",
    )
    assert non_finite_tensors(tmp_path) == (["inf", "nan"], 3)
    with pytest.raises(NonFiniteWeightsError, match="2 of 3 tensors hold NaN or inf"):
        assert_finite_checkpoint(tmp_path, "test checkpoint")


def test_a_directory_without_weights_is_an_error(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"no \.safetensors"):
        non_finite_tensors(tmp_path)


# --- degenerate outputs ---------------------------------------------------------------------------


def _completions(texts: list[str], answers: list[str | None], finish: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"completion": texts, "answer": answers, "finish_reason": finish})


THRESHOLDS = {
    "min_answer_rate": 0.1,
    "max_truncation_rate": 0.9,
    "max_identical_share": 0.5,
    "max_unevaluated_rate": 0.5,
}


def test_healthy_outputs_pass():
    health = output_health(
        _completions(["1 + 2 = 3", "\\boxed{5}", "7", "it is 9"], ["3", "5", "7", None], ["stop"] * 4)
    )
    assert (health.answer_rate, health.truncation_rate, health.identical_share) == (0.75, 0.0, 0.25)
    assert degenerate_output_failure(health, unevaluated_rate=0.5, **THRESHOLDS) is None


def test_a_nan_model_s_outputs_fail_with_every_number():
    """What the H100 run's NaN checkpoint produced: the same text, no answer, every completion cut off."""
    health = output_health(_completions(["!!!!"] * 4, [None] * 4, ["length"] * 4))
    failure = degenerate_output_failure(health, unevaluated_rate=0.0, **THRESHOLDS)
    assert failure == (
        "degenerate outputs over 4 completions: answer rate 0.000 < 0.1; truncation rate 1.000 > 0.9; "
        "identical-completion share 1.000 > 0.5"
    )


def test_a_policy_that_restates_the_question_fails():
    """What the products task's seed 1 learned: `\\boxed{60 * 55}` for every product, which math-verify equated
    with the gold until the grading refused unevaluated expressions."""
    health = output_health(
        _completions([f"\\boxed{{{a} * 55}}" for a in (60, 61, 62)], ["60 * 55", "61 * 55", "62 * 55"], ["stop"] * 3)
    )
    assert degenerate_output_failure(health, unevaluated_rate=1.0, **THRESHOLDS) == (
        "degenerate outputs over 3 completions: unevaluated-expression answer rate 1.000 > 0.5"
    )


def test_smoke_fails_on_empty_text_or_when_all_run_to_the_limit():
    fine = output_health(_completions(["a", "b"], [None, None], ["length", "stop"]))
    all_cut = output_health(_completions(["a", "b"], [None, None], ["length", "length"]))
    empty = output_health(_completions(["a", "  "], [None, None], ["stop", "stop"]))
    bounds = {"max_empty_rate": 0.0, "max_truncation_rate": 0.75}
    assert smoke_failure(fine, **bounds) is None
    assert "100% ran to the token limit" in smoke_failure(all_cut, **bounds)
    assert "50% of the completions are empty" in smoke_failure(empty, **bounds)
    assert smoke_failure(all_cut, max_empty_rate=0.0, max_truncation_rate=1.0) is None
    assert smoke_failure(empty, max_empty_rate=0.5, max_truncation_rate=0.75) is None
