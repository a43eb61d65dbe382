"""The launcher kinds, by name: the one place a kind is listed (`launcher.kind` names one; the settings' `Launcher`
type, which may not import this layer, is checked against it in tests/unit/test_payload_commands.py)."""

from resources.launchers.base import Launcher
from resources.launchers.inprocess import InProcessLauncher
from resources.launchers.ray import RayLauncher
from resources.launchers.subprocess import SubprocessLauncher

LAUNCHERS: dict[str, type[Launcher]] = {
    launcher.kind: launcher for launcher in (InProcessLauncher, SubprocessLauncher, RayLauncher)
}


def launcher_class(kind: str) -> type[Launcher]:
    if kind not in LAUNCHERS:
        raise ValueError(f"launcher kind {kind!r} is not one of {tuple(LAUNCHERS)}")
    return LAUNCHERS[kind]
