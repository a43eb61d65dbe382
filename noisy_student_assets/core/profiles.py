"""Named settings profiles: `cpu` (default; a 2-core laptop, SmolLM2-135M) and `gpu` (one accelerator).

The profile is chosen once, by the environment variable `NOISY_STUDENT_PROFILE`, when the code location
loads. Each setting's values for both profiles are written side by side where the setting is defined
(`by_profile(cpu=..., gpu=...)` in `config.py`), so a setting has exactly one source of truth.
"""

from __future__ import annotations

from typing import TypeVar

from noisy_student_assets.core import environment

PROFILE_ENV_VAR = environment.PROFILE
PROFILES = ("cpu", "gpu")

T = TypeVar("T")


def active_profile() -> str:
    profile = environment.profile_name()
    if profile not in PROFILES:
        raise ValueError(f"{PROFILE_ENV_VAR}={profile!r} is not one of {', '.join(PROFILES)}")
    return profile


def by_profile(*, cpu: T, gpu: T) -> T:
    """The value of a setting under the active profile."""
    return gpu if active_profile() == "gpu" else cpu
