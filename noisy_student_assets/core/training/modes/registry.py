"""The student modes, by name: the one place a mode is listed (the arms, the run config, the assets and the
configuration reference all look modes up here). The settings cannot: the modes import them, and settings stay a
leaf; so settings are checked against their mode where they enter (`accepted`)."""

from noisy_student_assets.core.pseudo_labels.sources.registry import label_source
from noisy_student_assets.core.settings import PseudoLabelSettings, Settings, StudentSettings
from noisy_student_assets.core.training.modes.base import StudentMode
from noisy_student_assets.core.training.modes.dpo import DPOMode
from noisy_student_assets.core.training.modes.grpo import GRPOMode
from noisy_student_assets.core.training.modes.sft import SFTMode

MODES: dict[str, StudentMode] = {mode.name: mode for mode in (GRPOMode(), SFTMode(), DPOMode())}


def student_mode(name: str) -> StudentMode:
    if name not in MODES:
        raise ValueError(f"mode {name!r} is not one of {tuple(MODES)}")
    return MODES[name]


def student_mode_for(settings: StudentSettings) -> StudentMode:
    """The mode `settings` train in, once it accepts them; a ValueError saying why not."""
    mode = student_mode(settings.mode)
    if refusal := mode.refusal(settings):
        raise ValueError(refusal)
    return mode


def accepted(settings: Settings) -> Settings:
    """`settings`, checked where they enter (run config, arm, experiment file): a student's against its mode, a vote's
    label source against the registered ones."""
    if isinstance(settings, StudentSettings):
        student_mode_for(settings)
    if isinstance(settings, PseudoLabelSettings):
        label_source(settings.label_source)
    return settings
