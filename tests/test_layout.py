"""The package's import layout: no import cycles among offline_eval modules, and no private names crossing a
module line. Both are read from the source with `ast`, so a function-level import counts like a top-level
one (it is a cycle all the same, only deferred); imports under `if TYPE_CHECKING:` never run and do not count
towards cycles.

Importing `a.b.c` also runs the package `a.b` (its __init__), so that is an edge too, except for packages
that hold the importer: those are already being imported when it runs (a package's __init__ importing its
own submodules is how it exposes them, not a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "offline_eval"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def _modules() -> dict[str, Path]:
    """Module name -> file, for every module of the package (a package by its __init__.py)."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:`."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def _imports(name: str) -> list[tuple[str, list[str], bool]]:
    """(imported module, names taken from it, runs at runtime) for each import in module `name`."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    typing_only = _type_checking_only(tree)
    here = name if _is_package(name) else name.rpartition(".")[0]  # the package relative imports start from
    out = []
    for node in ast.walk(tree):
        runs = id(node) not in typing_only
        if isinstance(node, ast.Import):
            out += [(alias.name, [], runs) for alias in node.names if alias.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here.split(".")[:len(here.split(".")) - node.level + 1])
                base = ".".join(filter(None, [base, node.module]))
            else:
                base = node.module or ""
            if base.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{base}.{alias.name}"
                out.append((sub, [], runs) if sub in MODULES else (base, [alias.name], runs))
    return out


def _graph() -> dict[str, set[str]]:
    """Module -> the package modules importing it runs (see the module docstring)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for name in MODULES:
        for target, _, runs in _imports(name):
            if not runs:
                continue
            parts = target.split(".")
            for i in range(2, len(parts) + 1):  # the target and the packages on the way to it
                module = ".".join(parts[:i])
                holds_importer = name == module or name.startswith(module + ".")
                if module in MODULES and module != name and (module == target or not holds_importer):
                    graph[name].add(module)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as [a, b, ..., a], or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_the_layout_reader_sees_the_package():
    graph = _graph()
    assert f"{PACKAGE}.run.scheduler" in graph and f"{PACKAGE}.metrics.base" in graph
    assert f"{PACKAGE}.engines.base" in graph[f"{PACKAGE}.run.scheduler"]


def test_no_import_cycles():
    cycle = _cycle(_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_no_private_names_cross_modules():
    crossing = [f"{name} imports {taken} from {target}"
                for name in MODULES for target, names, _ in _imports(name) if target != name
                for taken in names if taken.startswith("_") and not taken.endswith("__")]  # dunders are public
    assert not crossing, "\n".join(crossing)


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []
