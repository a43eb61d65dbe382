"""How far an arm's rounds go (no Dagster here): the assets each round of an arm materializes, and the
stopping rule that the next-round automation (`defs/automation.py`) and the grid both apply.

An arm runs round N once everything before it is materialized (round 0: its task's problems, its base model, its
split, labeled RL and their evaluations), up to its `max_rounds`. With a `patience`, each round's student is also
evaluated on the arm's validation problems, and the arm stops once `patience` rounds in a row did not raise the best
validation accuracy so far by more than `min_improvement` (labeled RL's is round 0's). The held-out set never
decides anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from noisy_student_assets.core import layout
from noisy_student_assets.core.pseudo_labels.sources.registry import label_source
from noisy_student_assets.core.settings import VALIDATION_PROMOTION, RoundsSettings


def validated(arm) -> bool:
    """Whether the arm's rounds are evaluated on its validation problems: its stopping rule reads them, or its
    promotion compares each student with its teacher there before a next round."""
    rule = arm.stopping_rule
    promoted = arm.promotion_rule == VALIDATION_PROMOTION and rule.max_rounds > 1
    return rule.patience is not None or promoted


def verified(arm) -> bool:
    """Whether the arm's rounds train a verifier: its label source weighs samples by the verifier's scores."""
    return label_source(arm.label_source).reads_verifier


def pre_round_assets(experiment, arm) -> list[str]:
    """What round 1 of `arm` needs first (key paths joined by '/'), in dependency order."""
    names = [layout.PROBLEM_POOL, layout.EVAL_PROBLEMS, layout.BASE_MODEL]
    names += [layout.BASE_MODEL_EVAL] if experiment.held_out_eval else []
    names += [layout.LABELED_PROBLEMS, layout.UNLABELED_PROBLEMS, layout.VALIDATION_PROBLEMS, layout.LABELED_RL]
    names += [layout.LABELED_RL_EVAL] if experiment.held_out_eval or arm.stopping_rule.max_rounds else []
    names += [layout.LABELED_RL_VALIDATION] if experiment.validate_labeled_rl or validated(arm) else []
    return names


def round_assets(number: int, experiment, arm) -> list[str]:
    """Round `number`'s assets of `arm`, in dependency order."""
    return layout.round_asset_names(number, experiment.controls, validated(arm), verified(arm))


def asks_for(experiment, arm, name: str) -> bool:
    """Whether `experiment` materializes the asset `name` (a key path joined by '/') for `arm`, in whichever round it
    is: a control it does not list, or a validation its arm's stopping rule does not read, it does not."""
    prefix, _, _ = name.rpartition("/")
    listed = round_assets(layout.round_number(prefix), experiment, arm) if prefix else pre_round_assets(experiment, arm)
    return name in listed


def last_round(arm, rounds: int | None = None) -> int:
    """The last round of `arm` up to round `rounds` (default and at most: its `max_rounds`)."""
    return arm.stopping_rule.max_rounds if rounds is None else min(rounds, arm.stopping_rule.max_rounds)


def arm_assets(experiment, arm, rounds: int | None = None) -> list[str]:
    """Every asset of `arm` up to round `last_round(arm, rounds)`, in dependency order."""
    return pre_round_assets(experiment, arm) + [
        name for number in range(1, last_round(arm, rounds) + 1) for name in round_assets(number, experiment, arm)
    ]


@dataclass(frozen=True)
class AskedFor:
    """Which of the assets that only some arms run any arm of a set of experiments runs: the code location defines
    those alone, so that its lineage, its jobs and their launches hold nothing its experiments never run."""

    controls: tuple[str, ...]
    verifier: bool
    round_validation: bool
    every_arm_validated: bool
    """Every arm evaluates its students on validation: a round's job can then hold the evaluation (none skips it)."""
    labeled_rl_validation: bool

    @classmethod
    def of(cls, experiments: Iterable) -> AskedFor:
        experiments = list(experiments)
        arms = [(experiment, arm) for experiment in experiments for arm in experiment.all_arms()]
        return cls(
            controls=tuple(c for c in layout.CONTROLS if any(c in experiment.controls for experiment in experiments)),
            verifier=any(verified(arm) for _, arm in arms),
            round_validation=any(validated(arm) for _, arm in arms),
            every_arm_validated=bool(arms) and all(validated(arm) for _, arm in arms),
            labeled_rl_validation=any(experiment.validate_labeled_rl or validated(arm) for experiment, arm in arms),
        )

    @classmethod
    def everything(cls) -> AskedFor:
        """Every asset some arm could run: the graph code versions are computed over, whatever the experiments."""
        return cls(
            controls=layout.CONTROLS,
            verifier=True,
            round_validation=True,
            every_arm_validated=True,
            labeled_rl_validation=True,
        )


def validation_assets(done: int) -> list[str]:
    """The validation evals a stopping rule reads after round `done`: labeled RL's, then each round's student's."""
    return [layout.LABELED_RL_VALIDATION] + [
        "/".join(layout.round_asset(number, layout.STUDENT_VALIDATION)) for number in range(1, done + 1)
    ]


def stop_reason(rule: RoundsSettings, done: int, validation: Sequence[float] = ()) -> str | None:
    """Why an arm whose rounds 1..`done` are complete runs no further round, or None when round `done` + 1 is due.
    `validation[i]` is the greedy validation accuracy after round i (0: labeled RL), read only with a patience."""
    if done >= rule.max_rounds:
        return f"max_rounds={rule.max_rounds} reached"
    if rule.patience is None or done < rule.patience:
        return None
    if len(validation) != done + 1:
        raise ValueError(
            f"a patience reads the validation accuracy of labeled RL and of rounds 1..{done}: got {len(validation)} "
            "values"
        )
    best, best_round = validation[0], 0
    for number, accuracy in enumerate(validation[1:], start=1):
        if accuracy > best + rule.min_improvement:
            best, best_round = accuracy, number
    if done - best_round >= rule.patience:
        since = ", ".join(f"{accuracy:.3f}" for accuracy in validation[best_round + 1 :])
        return (
            f"patience={rule.patience}: validation accuracy did not improve on round {best_round}'s {best:.3f} "
            f"(by more than {rule.min_improvement}) in the {done - best_round} round(s) since ({since})"
        )
    return None
