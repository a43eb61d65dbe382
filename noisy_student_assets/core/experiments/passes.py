"""How often each of an arm's GRPO runs sees its problems: its prompts (steps x prompts per step) over the distinct
problems it may train on (no Dagster here).

Extra data can only matter once training outruns the labels: a labeled-only control that sees its few labels many
times can have learned what they teach, where a gold-label control drawing the same prompts from many problems sees
each about once. The headroom table prints these per arm, and an experiment that asks whether data helps states them
(`experiments/passes.yaml`).
"""

from __future__ import annotations

from noisy_student_assets.core.experiments.arms import LABELED_ONLY, LABELED_RL, PROBLEM_SPLIT, STUDENT, Arm
from noisy_student_assets.core.layout import GOLD_LABEL
from noisy_student_assets.core.layout import LABELED_ONLY as LABELED_ONLY_CONTROL

LABELED_RL_RUN = "labeled_rl"


def arm_passes(arm: Arm) -> dict[str, float]:
    """Per GRPO run of `arm`'s first round (labeled RL, the labeled-only and the gold-label controls), the times it
    sees each of its problems on average: labeled RL and the labeled-only control train on the labeled problems, the
    gold-label control on those and the unlabeled ones (TRL's sampler cycles through a run's shuffled rows, so each is
    seen prompts / rows times, give or take one)."""
    split = arm.spec.settings(PROBLEM_SPLIT)
    labeled_rl = arm.spec.settings(LABELED_RL).grpo
    labeled_only = arm.spec.settings(LABELED_ONLY).grpo
    student = arm.spec.settings(STUDENT)
    gold_problems = (0 if student.pseudo_only else split.n_labeled) + split.n_unlabeled
    return {
        LABELED_RL_RUN: labeled_rl.max_steps * labeled_rl.prompts_per_step / split.n_labeled,
        LABELED_ONLY_CONTROL: labeled_only.max_steps * labeled_only.prompts_per_step / split.n_labeled,
        GOLD_LABEL: student.grpo.max_steps * student.grpo.prompts_per_step / gold_problems if gold_problems else 0.0,
    }
