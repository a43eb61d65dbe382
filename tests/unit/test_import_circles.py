"""No import circle in the product (`noisy_student_assets/`, `resources/`): every import of a project module counts,
those inside functions too, since a circle closed at call time is still one the reader has to follow."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("noisy_student_assets", "resources")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(tree: ast.AST, module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `module` imports anywhere in its file (a name imported from a package that is a module of
    its own counts as that module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])]
                )
            targets |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    return {target for target in targets if target in modules and target != module}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {module: _imported(ast.parse(path.read_text()), module, path, modules) for module, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle once, as the path that closes it (a depth-first search's back edges)."""
    found, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                found.append([*path[path.index(imported) :], imported])
            elif imported not in state:
                visit(imported, [*path, imported])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def test_the_product_has_no_import_circle() -> None:
    assert circles(import_graph()) == []


def test_a_circle_closed_inside_a_function_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c", "a"]]
    tree = ast.parse("def f():\n    from noisy_student_assets.core import layout\n")
    modules = _modules()
    module = "noisy_student_assets.core.settings"
    assert _imported(tree, module, modules[module], modules) == {"noisy_student_assets.core.layout"}
