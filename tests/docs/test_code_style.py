"""The code style CI holds the tree to: ruff's linter and formatter, configured in pyproject.toml
(``[tool.ruff]``) (fix a failure with ``ruff check --fix . && ruff format .``), and no import cycles
in fedray/ and benchmarks/, type-only and function-level imports included."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_the_tree_passes_ruff(command):
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it comes with the test extra: pip install -e '.[test]')")
    result = subprocess.run([ruff, *command], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


# ---------------------------------------------------------------------------- import cycles


def _module_names(roots: tuple[str, ...]) -> dict[str, Path]:
    names = {}
    for root in roots:
        for path in (REPO / root).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph(roots: tuple[str, ...] = ("fedray", "benchmarks")) -> dict[str, dict[str, int]]:
    """module → {imported module of ``roots`` → the line of its first import}, for every ``import``
    and ``from ... import`` anywhere in the module: at the top, inside functions, and under ``if
    TYPE_CHECKING:`` (a type-only import is a dependency too). ``from package import name`` counts as
    an import of ``package.name`` when that is a module, else of ``package``. A benchmark script's
    ``import w1_overhead`` (its folder is on ``sys.path``) is its sibling's module. A package's
    ``__init__`` that Python runs before a submodule is not counted, only what is written."""
    modules = _module_names(roots)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                candidates = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for candidate in candidates:
                if module.startswith("benchmarks") and not getattr(node, "level", 0) and f"{package}.{candidate.split('.')[0]}" in modules:
                    candidate = f"{package}.{candidate}"  # a benchmark script's sibling (its folder is on sys.path)
                name = candidate
                while name and name not in modules:  # `from package import function`: the package
                    name = name.rpartition(".")[0]
                if name and name != module:
                    edges.setdefault(name, node.lineno)
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_the_import_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert "fedray.runtime.engine" in graph["fedray.runtime.experiment"]  # a plain top-level import
    assert "fedray.algorithms.requirements" in graph["fedray.runtime.experiment"]  # inside a function
    assert "fedray.algorithms.base" in graph["fedray.algorithms.costs"]  # under TYPE_CHECKING
    assert "benchmarks.w1_overhead" in graph["benchmarks.startup"]  # a benchmark script's sibling
    assert import_cycles({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}) == [["a", "b", "c"]]


def test_no_import_cycles_in_fedray_and_benchmarks():
    """No module imports, directly or through others, a module that imports it: not at the top, not
    inside a function, not for type hints only, not within a package. A cycle is broken by moving
    what both sides need to the module that owns it (or a small one both import), never by hiding
    an import inside a function."""
    graph = import_graph()
    lines = []
    for cycle in import_cycles(graph):
        edges = [f"{a} -> {b} (line {graph[a][b]})" for a in cycle for b in graph[a] if b in cycle]
        lines.append(" <-> ".join(cycle) + ":\n    " + "\n    ".join(edges))
    assert not lines, "import cycles:\n" + "\n".join(lines)
