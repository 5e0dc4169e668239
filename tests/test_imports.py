"""The package's modules import one another in one direction: no cycles, counting the imports
inside functions too (a lazy import still ties two modules together)."""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "spmlkit"


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [f"{target}.{a.name}" for a in node.names]
                found = [n for n in names if n in modules] or [target]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names if a.name.startswith("spmlkit")]
            else:
                continue
            for target in found:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                # a package's __init__ that gathers its own submodules is not a dependency of
                # those submodules on each other
                if target in modules and target != name and not (
                        path.name == "__init__.py" and target.startswith(name + ".")):
                    graph[name].add(target)
    return graph


def cycles(graph) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


#: what each floor may not import (a lazy import inside a function counts): the machine's
#: resources, the writer rule and the declared constraints are the ground floor; the data
#: floor knows no features, and the loader that joins them (`spmlkit.loading`) stands above
#: both; the feature cache and the engine are handed nothing from each other
FLOORS = {
    "spmlkit.machine": ("spmlkit",),
    "spmlkit.safe_write": ("spmlkit",),
    "spmlkit.constraints": ("spmlkit",),
    "spmlkit.data": ("spmlkit.features", "spmlkit.loading", "spmlkit.engine",
                     "spmlkit.methods", "spmlkit.experiments", "spmlkit.cli", "spmlkit.losses"),
    "spmlkit.features": ("spmlkit.loading", "spmlkit.engine", "spmlkit.methods",
                         "spmlkit.experiments", "spmlkit.cli"),
    "spmlkit.engine": ("spmlkit.features", "spmlkit.loading", "spmlkit.methods",
                       "spmlkit.experiments", "spmlkit.cli"),
}


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_no_floor_imports_one_above_it():
    graph = import_graph()
    wrong = sorted((m, t) for floor, banned in FLOORS.items() for m in graph
                   if _under(m, floor) for t in graph[m]
                   if any(_under(t, b) for b in banned) and not _under(t, floor))
    assert wrong == []


def test_the_engine_imports_no_loss_family():
    """The engine trains every loss through the loss contract: of `spmlkit.losses` it imports
    the package and its contract only, never a family's module (the closed-form gradient is
    `SPMLLoss.closed_form_step`, not a helper of `spmlkit.losses.cole`)."""
    graph = import_graph()
    wrong = sorted((m, t) for m in graph if _under(m, "spmlkit.engine") for t in graph[m]
                   if _under(t, "spmlkit.losses")
                   and t not in ("spmlkit.losses", "spmlkit.losses.contract"))
    assert wrong == []
