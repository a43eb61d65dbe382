"""The run config of each op (`dg.Config`), derived from the stage's settings in `core/settings.py`: the same
fields, types, per-profile defaults and help, so the launchpad and `--config-json` take exactly the settings the
core reads. No field is declared here."""

from __future__ import annotations

from typing import ClassVar

import dagster as dg

from noisy_student_assets.core.experiments.arms import STAGE_SETTINGS, apply, overridden
from noisy_student_assets.core.settings import (
    BaseModelSettings,
    EvalProblemsSettings,
    EvalSettings,
    LabeledOnlySettings,
    LabeledRLSettings,
    ProblemPoolSettings,
    ProblemSplitSettings,
    PromotionSettings,
    PseudoLabelSettings,
    Settings,
    SmokeSettings,
    StudentSettings,
    TeacherSamplingSettings,
    VerifierSettings,
)
from noisy_student_assets.core.training.modes.registry import accepted
from resources.derived import derived_class

_STAGE_OF = {settings: stage for stage, settings in STAGE_SETTINGS.items()}


class StageConfig(dg.Config):
    """A stage's run config; `to_settings` gives the core settings it stands for."""

    settings_class: ClassVar[type[Settings]]
    arm_stage: ClassVar[str | None]
    """The experiment stage whose arm fields override this config (None: no arm field reaches it)."""

    def to_settings(self) -> Settings:
        return self.settings_class(**self.model_dump())


def stage_config(settings: type[Settings]) -> type[StageConfig]:
    config = derived_class(settings, settings.__name__.removesuffix("Settings") + "Config", StageConfig)
    config.settings_class = settings
    config.arm_stage = _STAGE_OF.get(settings)
    return config


# The problem tables' (assets/problems.py)
ProblemPoolConfig, EvalProblemsConfig, ProblemSplitConfig = map(
    stage_config, (ProblemPoolSettings, EvalProblemsSettings, ProblemSplitSettings)
)
# The checkpoints', their evaluations' and checks' (assets/models.py, checks.py)
BaseModelConfig, LabeledRLConfig, EvalConfig, SmokeConfig = map(
    stage_config, (BaseModelSettings, LabeledRLSettings, EvalSettings, SmokeSettings)
)
# A round's and its controls' (assets/rounds.py, assets/controls.py)
SamplingConfig, VerifierConfig, PseudoLabelConfig, StudentConfig, LabeledOnlyConfig, PromotionConfig = map(
    stage_config,
    (
        TeacherSamplingSettings,
        VerifierSettings,
        PseudoLabelSettings,
        StudentSettings,
        LabeledOnlySettings,
        PromotionSettings,
    ),
)


def with_arm(config: StageConfig, arm) -> tuple[Settings, list[str]]:
    """The settings `config` stands for, with the arm's overrides of its stage written over them, and the run-config
    settings those overrides replaced ('tau=0.8 -> 0.5'), so that a launchpad value the arm overrules is never lost
    silently."""
    values = config.model_dump()
    if arm is None or config.arm_stage is None:
        return accepted(config.settings_class(**values)), []
    overrides = arm.overrides(config.arm_stage)
    replaced = overridden(values, overrides, type(config)().model_dump())
    return accepted(config.settings_class(**apply(values, overrides))), replaced
