"""Guards that keep a broken model from being trained further or published (no Dagster here).

- `NonFiniteStepGuard`: a transformers `TrainerCallback` that skips an optimizer step whose loss or
  gradient norm is not finite (no update, gradients dropped), counts the skips, and stops training
  after too many in a row. GRPO in bf16 goes NaN now and then, nondeterministically; clipping does not
  help, because the clip factor is computed from the NaN norm. Skipping the step is what other trainers
  do (e.g. fairseq's and Megatron-LM's "skip the update on NaN/inf grad norm").
- `non_finite_tensors`: the tensors of a saved checkpoint that hold a NaN or an infinity, checked
  before a checkpoint is published and by the checkpoint assets' checks.
- `output_health`, `degenerate_output_failure`, `smoke_failure`: whether a batch of completions looks
  broken (no answers, every one cut off at the token limit, the same text for every prompt), with the
  numbers that say so, for the eval reports' and the checkpoints' checks.

torch and transformers are imported inside the functions (or when the callback class is first built),
so that the Dagster code location, which imports the settings, loads without them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import polars as pl


class NonFiniteTrainingError(RuntimeError):
    """Training stopped: too many consecutive optimizer steps had a non-finite loss or gradient norm."""


class NonFiniteWeightsError(ValueError):
    """A checkpoint holds NaN or infinite weights."""


def non_finite_tensors(checkpoint_dir: Path) -> tuple[list[str], int]:
    """The names of the tensors in `checkpoint_dir`'s safetensors files that hold a NaN or an infinity,
    and the number of tensors read."""
    import torch
    from safetensors import safe_open

    files = sorted(checkpoint_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{checkpoint_dir} holds no .safetensors weights")
    bad, total = [], 0
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                total += 1
                if not torch.isfinite(handle.get_tensor(name)).all():
                    bad.append(name)
    return bad, total


def assert_finite_checkpoint(checkpoint_dir: Path, what: str) -> None:
    """Raise `NonFiniteWeightsError` naming the broken tensors unless every weight is finite."""
    bad, total = non_finite_tensors(checkpoint_dir)
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise NonFiniteWeightsError(
            f"{what}: {len(bad)} of {total} tensors hold NaN or inf ({shown}); the checkpoint is not published"
        )


@dataclass
class StepGuardState:
    """What the guard saw during one `trainer.train()` call."""

    skipped_steps: list[int]
    """Optimizer steps (1-based, as TRL logs them) whose update was skipped."""
    consecutive: int = 0


def step_guard_callback(max_consecutive_skips: int, warn: Callable[[str], None] | None = None):
    """A `NonFiniteStepGuard` instance (the class is built on first use: it subclasses transformers')."""
    return _guard_class()(max_consecutive_skips, warn)


@cache
def _guard_class() -> type:
    import math

    import torch
    from transformers import TrainerCallback

    from noisy_student_assets.core.resumable import latest_whole_checkpoint

    class NonFiniteStepGuard(TrainerCallback):
        """Skip an optimizer step whose loss or gradient norm is not finite; stop after
        `max_consecutive_skips` skipped steps in a row.

        The trainer must report each micro-batch's loss through `observe_loss` (see
        `guarded_trainer_class`). A skipped step drops every gradient before `optimizer.step()`, so
        AdamW updates neither weights nor moments, and no resumable checkpoint is saved after it: the
        latest checkpoint is always one of a good step.
        """

        def __init__(self, max_consecutive_skips: int, warn: Callable[[str], None] | None) -> None:
            self.max_consecutive_skips = max_consecutive_skips
            self.warn = warn or (lambda message: None)
            self.state = StepGuardState(skipped_steps=[])
            self._losses_finite = True
            self._skipped_this_step = False

        def observe_loss(self, loss) -> None:
            self._losses_finite = self._losses_finite and bool(torch.isfinite(loss.detach()).all())

        def on_step_begin(self, args, state, control, **kwargs):
            self._losses_finite = True
            self._skipped_this_step = False

        def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            grad_norm = (
                torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
                if grads
                else None
            )
            grad_finite = grad_norm is None or bool(torch.isfinite(grad_norm))
            if self._losses_finite and grad_finite:
                self.state.consecutive = 0
                return
            step = state.global_step + 1
            optimizer.zero_grad(set_to_none=True)  # no gradient: the optimizer leaves weights and moments alone
            self._skipped_this_step = True
            self.state.skipped_steps.append(step)
            self.state.consecutive += 1
            what = "loss" if not self._losses_finite else "gradient norm"
            norm = float(grad_norm) if grad_norm is not None else math.nan
            self.warn(
                f"step {step}: non-finite {what} (grad norm {norm}); skipped the optimizer step "
                f"({self.state.consecutive} in a row, {len(self.state.skipped_steps)} in this run)"
            )
            if self.state.consecutive >= self.max_consecutive_skips:
                last = latest_whole_checkpoint(Path(args.output_dir))
                resume = (
                    f"the last good resumable checkpoint is {last}; re-materializing resumes from it"
                    if last
                    else "no resumable checkpoint was saved (save_steps=0 or none reached); a re-run starts over"
                )
                raise NonFiniteTrainingError(
                    f"training stopped at step {step}: {self.state.consecutive} consecutive optimizer steps "
                    f"(steps {', '.join(map(str, self.state.skipped_steps[-self.state.consecutive :]))}) had a "
                    f"non-finite loss or gradient norm; {resume}. Nothing was published."
                )

        def on_step_end(self, args, state, control, **kwargs):
            if self._skipped_this_step:
                control.should_save = False  # the latest checkpoint stays that of a good step
            return control

    return NonFiniteStepGuard


def guarded_trainer_class(trainer_class: type) -> type:
    """`trainer_class` with its `training_step` reporting each micro-batch's loss to the
    `NonFiniteStepGuard` among its callbacks (the callback API never sees the loss)."""
    return _guarded(trainer_class, _guard_class())


@cache
def _guarded(trainer_class: type, guard_class: type) -> type:
    class Guarded(trainer_class):
        def training_step(self, *args, **kwargs):
            loss = super().training_step(*args, **kwargs)
            for callback in self.callback_handler.callbacks:
                if isinstance(callback, guard_class):
                    callback.observe_loss(loss)
            return loss

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{trainer_class.__name__}"
    return Guarded


@dataclass(frozen=True)
class OutputHealth:
    """How a batch of completions looks, regardless of whether its answers are right."""

    completions: int
    answer_rate: float
    """Share of completions from which a final answer could be extracted."""
    truncation_rate: float
    """Share that ran to the token limit instead of ending by themselves."""
    empty_rate: float
    """Share whose text is empty or whitespace."""
    identical_share: float
    """Share taken by the most common completion text: near 1 when the model says the same thing to every prompt."""

    def as_dict(self) -> dict[str, float]:
        return {
            "answer_rate": self.answer_rate,
            "truncation_rate": self.truncation_rate,
            "empty_rate": self.empty_rate,
            "identical_completion_share": self.identical_share,
        }


def output_health(completions: pl.DataFrame) -> OutputHealth:
    """`OutputHealth` of a generations table (columns `completion`, `answer`, `finish_reason`)."""
    if completions.is_empty():
        raise ValueError("no completions to judge")
    texts = completions["completion"]
    return OutputHealth(
        completions=completions.height,
        answer_rate=float(completions["answer"].is_not_null().mean()),
        truncation_rate=float((completions["finish_reason"] == "length").mean()),
        empty_rate=float((texts.str.strip_chars() == "").mean()),
        identical_share=float(texts.value_counts()["count"].max() / completions.height),
    )


def degenerate_output_failure(
    health: OutputHealth,
    *,
    unevaluated_rate: float,
    min_answer_rate: float,
    max_truncation_rate: float,
    max_identical_share: float,
    max_unevaluated_rate: float,
) -> str | None:
    """Why the completions look degenerate (every threshold crossed, with its numbers), or None.

    `unevaluated_rate` is the share of answers that restate a numeric question's arithmetic instead of
    evaluating it (`grading.unevaluated`): graded wrong, but past the bound it is a policy that learned to.
    """
    reasons = []
    if health.answer_rate < min_answer_rate:
        reasons.append(f"answer rate {health.answer_rate:.3f} < {min_answer_rate}")
    if health.truncation_rate > max_truncation_rate:
        reasons.append(f"truncation rate {health.truncation_rate:.3f} > {max_truncation_rate}")
    if health.identical_share > max_identical_share:
        reasons.append(f"identical-completion share {health.identical_share:.3f} > {max_identical_share}")
    if unevaluated_rate > max_unevaluated_rate:
        reasons.append(f"unevaluated-expression answer rate {unevaluated_rate:.3f} > {max_unevaluated_rate}")
    return _verdict(f"degenerate outputs over {health.completions} completions", reasons)


def smoke_failure(health: OutputHealth, *, max_empty_rate: float, max_truncation_rate: float) -> str | None:
    """Why a checkpoint's smoke completions look broken, or None: more of them empty (or whitespace), or
    running to the token limit, than the bounds allow."""
    reasons = []
    if health.empty_rate > max_empty_rate:
        reasons.append(f"{health.empty_rate:.0%} of the completions are empty (allowed: {max_empty_rate:.0%})")
    if health.truncation_rate > max_truncation_rate:
        reasons.append(f"{health.truncation_rate:.0%} ran to the token limit (allowed: {max_truncation_rate:.0%})")
    return _verdict(f"smoke generation over {health.completions} prompts", reasons)


def _verdict(subject: str, reasons: list[str]) -> str | None:
    return f"{subject}: " + "; ".join(reasons) if reasons else None
