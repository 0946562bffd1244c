"""The package's structure: its imports form no cycle, and no module outside a family's own
switches on that family (the family protocol is the only way in)."""

from __future__ import annotations

import ast
from pathlib import Path

from cutlass_convt import choose

PACKAGE = Path(__file__).parents[1] / "cutlass_convt"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The package's modules that ``path`` imports (at any depth of its code)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.startswith("cutlass_convt"):
                for alias in node.names:  # "from . import x" may import a module x
                    candidate = f"{base}.{alias.name}"
                    found.add(candidate if _exists(candidate) else base)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("cutlass_convt"))
    return {m for m in found if m != name}


def _exists(module: str) -> bool:
    path = PACKAGE.parent / Path(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_imports_have_no_cycle():
    """A module's imports of its own package's ``__init__`` (Python loads it first anyway) do
    not count; every other edge must leave the graph acyclic."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: {m for m in _imports(path) if m in modules and not name.startswith(m + ".")}
             for name, path in modules.items()}
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(trail + [node, nxt]))
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_no_module_outside_a_family_names_its_configuration():
    """Only a family's own module (and the registry that lists it) names its configuration
    class: the rest of the package goes through the protocol."""
    classes = {f.config_class.__name__: f.config_class.__module__ for f in choose.FAMILIES}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        text = path.read_text()
        offenders += [f"{name}: {cls}" for cls, owner in classes.items()
                      if name != owner and cls in text]
    assert not offenders, offenders
