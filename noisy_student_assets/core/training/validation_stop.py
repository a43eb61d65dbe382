"""The stopping rule's stalled-validation arm (no Dagster here): a GRPO run checks its greedy accuracy on the arm's
validation problems every few optimizer steps (`grpo.validation_every`), stops once `validation_patience` checks in a
row did not beat the best, and keeps the best check's weights as its checkpoint. Noisy Student's teacher labels once
it has fitted its labels; a held-out split of them tells when more steps stop helping, where the training reward (the
rule's saturation arm) is too noisy over a few prompts a step to call it.

Each check generates through the run's vLLM engine (`rollouts.VllmRollouts.greedy`), which holds the policy's weights
for the next step's groups anyway, and is graded as an evaluation grades (`grading.answers_equivalent`, an ungraded
check left out). The accuracy goes into the trainer's step log (`VALIDATION_LOGGED`), so that a resumed run reads the
checks before it and the checkpoint's training log records them; the best check's trainable weights wait in the work
dir until the run ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from noisy_student_assets.core.grading import answers_equivalent, extract_answer
from noisy_student_assets.core.prompts import DEFAULT_SYSTEM_PROMPT, student_messages

if TYPE_CHECKING:
    import polars as pl

    from noisy_student_assets.core.training.rollouts import VllmRollouts

VALIDATION_LOGGED = "validation/greedy_accuracy"
"""The step log's entry of a check: the greedy accuracy on the validation problems after that step."""
BEST_WEIGHTS = "validation-best-step-{step}.safetensors"
"""The work dir's file of the best check's trainable weights."""


@dataclass(frozen=True)
class Check:
    step: int
    accuracy: float


def logged_checks(log_history: list[dict]) -> list[Check]:
    """The validation checks a run logged, in step order."""
    return [Check(int(entry["step"]), entry[VALIDATION_LOGGED]) for entry in log_history if VALIDATION_LOGGED in entry]


def best_check(checks: list[Check]) -> Check | None:
    """The check of highest accuracy, the earliest of a tie (a later one that only equals it is no improvement)."""
    return max(checks, key=lambda check: check.accuracy, default=None)  # max keeps the first of equals


def stalled(checks: list[Check], patience: int) -> bool:
    """Whether the last `patience` checks came after the best one, none beating it."""
    best = best_check(checks)
    return best is not None and sum(check.step > best.step for check in checks) >= patience


def require_validation(every: int, problems: pl.DataFrame | None) -> None:
    """Refuse a run checked every `every` steps (`grpo.validation_every`) that is given no validation problems: only
    labeled RL is given them."""
    if every and problems is None:
        raise ValueError(
            "grpo.validation_every is set, but the run is given no validation problems to check itself on: only "
            "labeled RL is (labeled_rl_validation_every)"
        )


def validation_prompts(problems: pl.DataFrame) -> list[list[dict]]:
    """The validation problems as the student's chat prompts, without prompt noise (as an evaluation sees them)."""
    return [
        student_messages(row["problem_id"], row["prompt"], DEFAULT_SYSTEM_PROMPT, None)
        for row in problems.iter_rows(named=True)
    ]


def greedy_accuracy(completions: list[str], gold_answers: list[str]) -> float:
    """The share of graded completions whose final answer is equivalent to the gold (0 where none is graded)."""
    verdicts = [
        answers_equivalent(gold, extract_answer(text)) for text, gold in zip(completions, gold_answers, strict=True)
    ]
    graded = [verdict for verdict in verdicts if verdict is not None]
    return sum(graded) / len(graded) if graded else 0.0


def validation_stop_callback(every: int, patience: int, problems: pl.DataFrame, engine: VllmRollouts, work_dir: Path):
    """A transformers `TrainerCallback` for the stalled-validation arm: a check after every `every` steps, at
    the run's last step and where another rule stops the run; the stop once the checks stall; the best check's weights
    loaded back as training ends. `engine` must be the one sampling the run's groups; its `extra_prompts` must hold
    `validation_prompts(problems)`. The class is built on first use, as transformers is imported only where a run
    trains."""
    from transformers import TrainerCallback

    gold = list(problems["gold_answer"])
    prompts = validation_prompts(problems)

    class ValidationStopCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            # a run resumed after its stall (a checkpoint is saved at the stalled check's step) stays stopped
            if stalled(logged_checks(state.log_history), patience):
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, model=None, processing_class=None, **kwargs):
            step = state.global_step
            due = step % every == 0 or step >= state.max_steps or control.should_training_stop
            entry = state.log_history[-1] if state.log_history else {}
            # one check a step, on its step log (the run's summary log comes after the last step's, at the same step)
            if not due or entry.get("step") != step or "train_runtime" in entry or VALIDATION_LOGGED in entry:
                return
            accuracy = self._check(model, processing_class, step, args)
            # the step log keeps it; the run's own step logger, a later callback, prints it from `logs`
            entry[VALIDATION_LOGGED] = logs[VALIDATION_LOGGED] = accuracy
            checks = logged_checks(state.log_history)
            if best_check(checks).step == step:
                _keep_best(model, work_dir, step)
            if stalled(checks, patience):
                control.should_training_stop = True

        def on_save(self, args, state, control, **kwargs):
            # a resumed run reads its best check from the saved log: an earlier best's weights go once it is saved
            best = best_check(logged_checks(state.log_history))
            if best is not None:
                _drop_best_before(work_dir, best.step)

        def on_train_end(self, args, state, control, model=None, **kwargs):
            best = best_check(logged_checks(state.log_history))
            if best is not None and best.step != state.global_step:
                _restore_best(model, work_dir, best.step)

        def _check(self, model, tokenizer, step: int, args) -> float:
            from noisy_student_assets.core.sampling import stop_token_ids

            ids = tokenizer.apply_chat_template(
                conversation=prompts, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
            stop_ids = sorted(stop_token_ids(model.generation_config.eos_token_id, tokenizer))
            completions = engine.greedy(ids, model, step, args.max_completion_length, stop_ids)
            return greedy_accuracy(tokenizer.batch_decode(completions, skip_special_tokens=True), gold)

    return ValidationStopCallback()


def _trainable(model) -> dict:
    return {name: parameter.detach() for name, parameter in model.named_parameters() if parameter.requires_grad}


def _keep_best(model, work_dir: Path, step: int) -> None:
    """Save `model`'s trainable weights (the LoRA adapters, or every weight) as the best check's, at step `step`."""
    from safetensors.torch import save_file

    save_file(
        {name: weight.contiguous() for name, weight in _trainable(model).items()},
        work_dir / BEST_WEIGHTS.format(step=step),
    )


def _drop_best_before(work_dir: Path, step: int) -> None:
    """Delete the saved weights of earlier best checks than step `step`'s."""
    for path in work_dir.glob(BEST_WEIGHTS.format(step="*")):
        if int(path.stem.rsplit("-", 1)[1]) < step:
            path.unlink()


def _restore_best(model, work_dir: Path, step: int) -> None:
    """Load the best check's trainable weights (step `step`) back into `model`."""
    from safetensors.torch import load_file

    path = work_dir / BEST_WEIGHTS.format(step=step)
    if not path.exists():
        raise FileNotFoundError(f"the best validation check's weights (step {step}) are not in {work_dir}")
    weights = load_file(path)
    missing = set(_trainable(model)) - set(weights)
    if missing:
        raise ValueError(f"{path.name} lacks trainable weights of the model: {sorted(missing)[:3]}")
    model.load_state_dict(weights, strict=False)
