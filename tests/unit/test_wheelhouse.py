"""The wheelhouse's pure parts (tools/wheelhouse.py): what a node list says it has, which distribution a recorded
module comes from, which platforms a manylinux target takes, and how files are split into parts and put back
together. Building one and installing it offline: tests/e2e/test_offline_install.py."""

from __future__ import annotations

import hashlib
import random
import subprocess
from pathlib import Path

from tools.wheelhouse import (
    Target,
    distributions_of,
    install_script,
    installed_modules,
    manylinux_platforms,
    module_names,
    pack,
    read_node_list,
    write_parts,
)


def test_a_node_list_is_read_from_pip_list_pip_freeze_or_names() -> None:
    pip_list = "Package            Version\n------------------ -----------\nTorch              2.11.0\nnumpy 2.3.1\n"
    freeze = "transformers==5.17.0\nmy_pkg @ file:///tmp/my_pkg\n# a comment\n"
    assert read_node_list(pip_list) == {"torch": "2.11.0", "numpy": "2.3.1"}
    assert read_node_list(freeze) == {"transformers": "5.17.0", "my-pkg": None}
    assert read_node_list("Peft\n") == {"peft": None}


def test_module_names_come_from_a_distribution_s_python_files_and_extensions_only() -> None:
    files = [
        "google/protobuf/__init__.py",
        "google/protobuf/message.py",
        "polars/_plr.cpython-312-x86_64-linux-gnu.so",
        "polars/__pycache__/x.cpython-312.pyc",
        "polars-2.1.0.dist-info/RECORD",
        "../../../bin/polars",
        "polars/py.typed",
    ]
    assert module_names(files) == ["google.protobuf", "google.protobuf.message", "polars._plr"]


def test_each_recorded_module_counts_for_the_distribution_holding_it_or_the_nearest_package_above() -> None:
    providers = {
        "google.protobuf": {"protobuf"},
        "google.auth": {"google-auth"},
        "six": {"six"},
        "httpx2": {"httpx2"},
    }
    modules = {"google", "google.protobuf", "google.auth.transport", "six.moves.urllib", "json", "sys", "mystery.x"}
    found, unmapped = distributions_of(modules, providers)
    assert found == {
        "google-auth": ["google.auth.transport"],
        "protobuf": ["google.protobuf"],
        "six": ["six.moves.urllib"],
    }, "a namespace package's parts go to their own distributions; httpx2, never imported, is not carried"
    assert unmapped == ["google", "mystery"], "the standard library is no distribution's, and not reported"


def test_a_manylinux_target_takes_every_older_glibc_s_wheels_too() -> None:
    platforms = manylinux_platforms("2.28", "x86_64")
    assert platforms[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in platforms
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(platforms)
    assert "manylinux_2_29_x86_64" not in platforms
    assert "manylinux2014_x86_64" not in manylinux_platforms("2.12", "x86_64")
    options = Target("3.12", platforms).pip_options()
    assert options[:6] == ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]
    assert options.count("--platform") == len(platforms)
    assert Target().pip_options() == [], "this interpreter: pip's own tags"


def test_no_part_is_larger_than_asked_and_a_larger_file_is_cut_into_pieces_in_order() -> None:
    sizes = {"model.whl": 250, "polars.whl": 100, "a.whl": 60, "b.whl": 40, "c.whl": 1}
    parts = pack(sizes, 100)
    assert all(sum(piece.size for piece in part) <= 100 for part in parts)
    pieces = sorted((p for part in parts for p in part if p.file == "model.whl"), key=lambda p: p.offset)
    assert [(p.index, p.offset, p.size) for p in pieces] == [(0, 0, 100), (1, 100, 100), (2, 200, 50)]
    assert [p.name for p in pieces] == ["model.whl.part-000", "model.whl.part-001", "model.whl.part-002"]
    whole = [p for part in parts for p in part if p.file != "model.whl"]
    assert all(p.index is None for p in whole), "a file that fits a part stays whole (polars' is exactly one part)"
    assert sum(p.size for part in parts for p in part) == sum(sizes.values())
    assert [sorted(p.size for p in part) for part in parts] == [[100], [100], [100], [40, 60], [1, 50]], (
        "largest first, each into the first part it fits"
    )


def test_the_install_script_puts_every_file_back_together_and_checks_it(tmp_path: Path) -> None:
    """The script's own lines up to its pip call, run on parts written by `write_parts`: each file comes back
    byte for byte, and a changed piece fails its sha256."""
    rng = random.Random(0)
    source = tmp_path / "source"
    source.mkdir()
    files = {}
    for name, size in {"big-1.0-py3-none-any.whl": 2500, "small-1.0-py3-none-any.whl": 300, "x-1.tar.gz": 90}.items():
        files[name] = source / name
        files[name].write_bytes(rng.randbytes(size))
    bundle = tmp_path / "bundle"
    paths = write_parts(files, pack({n: p.stat().st_size for n, p in files.items()}, 1000), bundle)
    sha256 = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in files.items()}
    script = install_script(paths, sha256, sorted(n for n in files if n.endswith(".whl")), ["x-1.tar.gz"])
    assert all(path.stat().st_size <= 1000 for path in bundle.glob("part-*/*"))
    assert len(paths["big-1.0-py3-none-any.whl"]) == 3 and len(paths["small-1.0-py3-none-any.whl"]) == 1
    assert '-m pip install --no-index --no-deps "$@"' in script and "--no-build-isolation" in script
    until_pip = script.split('"$python" -m pip', 1)[0]
    (bundle / "check.sh").write_text(until_pip)
    subprocess.run(["bash", str(bundle / "check.sh")], check=True)
    assert (bundle / "assembled" / "big-1.0-py3-none-any.whl").read_bytes() == files[
        "big-1.0-py3-none-any.whl"
    ].read_bytes()

    piece = bundle / paths["big-1.0-py3-none-any.whl"][1]
    piece.write_bytes(b"x" + piece.read_bytes()[1:])
    assert subprocess.run(["bash", str(bundle / "check.sh")], capture_output=True).returncode != 0


def test_a_left_out_distribution_provides_no_module_so_an_import_of_it_that_failed_is_not_carried() -> None:
    everything, without_polars = installed_modules(set()), installed_modules({"polars"})
    assert everything["polars"] == {"polars"} and "polars" not in without_polars
    assert without_polars["_polars_runtime_32"] == {"polars-runtime-32"}, "only what the left-out one itself holds"
