"""Named settings profiles: `cpu` (default; a 2-core laptop, SmolLM2-135M) and `gpu` (one accelerator).

The profile is chosen once, by the environment variable `NOISY_STUDENT_PROFILE`, when the code location
loads. Each setting's values for both profiles are written side by side where the setting is defined
(`by_profile(cpu=..., gpu=...)` in `config.py`), so a setting has exactly one source of truth.
"""

from __future__ import annotations

import os
from typing import TypeVar

PROFILE_ENV_VAR = "NOISY_STUDENT_PROFILE"
PROFILES = ("cpu", "gpu")

T = TypeVar("T")


def active_profile() -> str:
    profile = os.environ.get(PROFILE_ENV_VAR, "cpu").strip().lower() or "cpu"
    if profile not in PROFILES:
        raise ValueError(f"{PROFILE_ENV_VAR}={profile!r} is not one of {', '.join(PROFILES)}")
    return profile


def by_profile(*, cpu: T, gpu: T) -> T:
    """The value of a setting under the active profile."""
    return gpu if active_profile() == "gpu" else cpu
