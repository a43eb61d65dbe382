"""The student modes, by name: the one place a mode is listed (the settings, the arms, the assets and the
configuration reference all look modes up here)."""

from noisy_student_assets.core.training.modes.base import StudentMode
from noisy_student_assets.core.training.modes.dpo import DPOMode
from noisy_student_assets.core.training.modes.grpo import GRPOMode
from noisy_student_assets.core.training.modes.sft import SFTMode

MODES: dict[str, StudentMode] = {mode.name: mode for mode in (GRPOMode(), SFTMode(), DPOMode())}


def student_mode(name: str) -> StudentMode:
    if name not in MODES:
        raise ValueError(f"mode {name!r} is not one of {tuple(MODES)}")
    return MODES[name]
