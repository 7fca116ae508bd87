"""The package's import graph has no cycle, counting imports inside functions (which hide them)
and imports under ``TYPE_CHECKING``: a lower layer never names an upper one.

An edge is each ``import``/``from ... import`` of an ``accel_kit`` module anywhere in a file.
``from package import name`` is an edge to ``package`` (its ``__init__``: the statement runs
it) and to the submodule ``package.name`` where one exists. ``from package.sub import name``
is an edge to ``package.sub`` only: Python runs the parent's ``__init__`` first, but a package
whose face imports its own parts is the ordinary way of giving it one, and those parts
importing each other by full name is no cycle through the face.

One level up, the packages (and top-level modules) of ``accel_kit`` form no cycle either: two
packages whose modules import each other's, even with no module-level cycle between them, are one
layer in two folders (``report`` reading through ``predict`` while ``predict`` reads through ``report``).
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "accel_kit"


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the accel_kit modules it imports (anywhere in the file)."""
    names = module_names()
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    pkg = name.split(".") if is_package else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                # The statement runs ``base`` (a package's face included), and any submodule it names.
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names
                                    if f"{base}.{alias.name}" in names]
            for target in targets:
                while target and target not in names:  # import a.b.c where only a.b is ours
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("accel_kit"):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def unit_of(module: str) -> str | None:
    """The package or top-level module of ``accel_kit`` that ``module`` belongs to (``accel_kit.report.what_if``
    -> ``accel_kit.report``); None for the package's face, ``accel_kit`` itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


def package_graph(graph: dict[str, set[str]]) -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """(package -> the packages its modules import, (package, package) -> the module imports behind the edge)."""
    packages: dict[str, set[str]] = {}
    why: dict[tuple[str, str], list[str]] = {}
    for module, targets in graph.items():
        a = unit_of(module)
        if a is None:
            continue
        packages.setdefault(a, set())
        for target in targets:
            b = unit_of(target)
            if b is not None and b != a:
                packages[a].add(b)
                packages.setdefault(b, set())
                why.setdefault((a, b), []).append(f"{module} -> {target}")
    return packages, why


def test_the_graph_sees_function_local_imports():
    graph = import_graph()
    # accel_kit.cli imports the studies inside its functions only.
    assert "accel_kit.studies" in graph["accel_kit.cli"] or any(
        t.startswith("accel_kit.studies") for t in graph["accel_kit.cli"])


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles (function-local imports counted):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_no_two_packages_import_each_other():
    packages, why = package_graph(import_graph())
    found = cycles(packages)
    lines = []
    for component in found:
        lines.append(" <-> ".join(component))
        lines += [f"    {edge}" for a in component for b in component if (a, b) in why for edge in why[(a, b)]]
    assert not found, "packages that import each other (function-local imports counted):\n" + "\n".join(lines)


def test_the_package_graph_sees_a_mutual_import():
    # two modules of two packages, each importing the other's package: no module cycle, one package cycle
    graph = {"accel_kit.a.x": {"accel_kit.b.y"}, "accel_kit.b.z": {"accel_kit.a.w"}, "accel_kit.a.w": set(),
             "accel_kit.b.y": set()}
    packages, why = package_graph(graph)
    assert not cycles(graph) and cycles(packages) == [["accel_kit.a", "accel_kit.b"]]
    assert why[("accel_kit.a", "accel_kit.b")] == ["accel_kit.a.x -> accel_kit.b.y"]


if __name__ == "__main__":
    for c in cycles(import_graph()) + cycles(package_graph(import_graph())[0]):
        print(" <-> ".join(c))
