"""The environment variables the project reads are read in one module, `core/environment.py`: no other module of the
package or of `resources/` looks a variable up (passing the whole environment on to a child process, or setting a
variable for a library, is not reading one)."""

from __future__ import annotations

import ast
from pathlib import Path

from noisy_student_assets.core import environment

ROOT = Path(__file__).resolve().parents[2]
READER = Path(environment.__file__).resolve()


def _is_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _reads(tree: ast.AST) -> list[int]:
    """The lines that look a variable up: `os.environ.get(...)`, `os.environ[...]`, `os.getenv(...)`,
    `os.environ.items()`."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            looked_up = _is_environ(node.func.value) and node.func.attr in {
                "get",
                "items",
                "keys",
                "values",
                "copy",
                "__getitem__",
            }
            if looked_up or (
                isinstance(node.func.value, ast.Name) and node.func.value.id == "os" and node.func.attr == "getenv"
            ):
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            lines.append(node.lineno)
    return lines


def test_the_finder_sees_a_read() -> None:
    assert _reads(
        ast.parse("import os\nos.environ.get('X')\nos.environ['Y']\nos.getenv('Z')\nenv = os.environ | {}")
    ) == [2, 3, 4]


def test_only_the_environment_module_reads_the_environment() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in ("noisy_student_assets", "resources")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.resolve() != READER
        for line in _reads(ast.parse(path.read_text()))
    ]
    assert found == [], "read the environment through core/environment.py"
