"""No function of the product is over 80 lines (house style): a longer one is a factory to cut into a table of
smaller ones, or a body to cut into helpers. A function is counted from its `def` to its last line, the functions and
classes nested in it included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
PRODUCT = sorted([*(REPOSITORY / "noisy_student_assets").rglob("*.py"), *(REPOSITORY / "resources").rglob("*.py")])
MOST_LINES = 80


def long_functions(source: str) -> list[str]:
    """Each function of `source` over `MOST_LINES` lines, as `name (lines)`."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > MOST_LINES
    ]


def test_the_check_finds_a_function_over_80_lines_nested_ones_counted() -> None:
    body = "".join(f"    x{index} = {index}\n" for index in range(MOST_LINES - 3))
    at_most = f"def short():\n{body}    return 0\n"
    over = f"def factory():\n    def inner():\n{body.replace('    ', '        ')}        return 0\n    return inner\n"
    assert long_functions(at_most) == []
    assert long_functions(over) == [f"factory ({MOST_LINES + 1} lines)"]


@pytest.mark.parametrize("path", PRODUCT, ids=lambda path: str(path.relative_to(REPOSITORY)))
def test_no_function_of_the_product_is_over_80_lines(path: Path) -> None:
    assert long_functions(path.read_text()) == []
