"""No module reads another package's private names: what a package keeps to itself (a ``_name``, a ``_module``)
may change without its readers knowing, so a reader elsewhere names only what the package makes public.

A package is a top-level subpackage of ``accel_kit`` (``accel_kit/report/``) or a top-level module
(``accel_kit/cli.py``). Found over the source with ``ast``: ``from accel_kit.X... import _name``,
``import accel_kit.X._mod`` (or any private part on the path), and ``mod._name`` where ``mod`` is bound by
an import of another package's module. Dunders (``__version__``) are public.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "accel_kit"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package_of(module: str) -> str:
    """``accel_kit.report.figures`` -> ``report``; ``accel_kit`` itself -> ``accel_kit``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def private_uses(source: str, module: str) -> list[str]:
    """Each use of another package's private name in ``source``, the text of module ``module``."""
    mine = _package_of(module)
    found: list[str] = []
    bound: dict[str, str] = {}  # local name -> the accel_kit module it names (for mod._name)
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("accel_kit") and _package_of(alias.name) != mine:
                    if any(_private(p) for p in alias.name.split(".")):
                        found.append(f"line {node.lineno}: import {alias.name}")
                    if alias.asname:
                        bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("accel_kit"):
            target = node.module
            other = _package_of(target) != mine or target == "accel_kit"
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if target == "accel_kit":  # from accel_kit import report: the name is a package of its own
                    other = alias.name != mine
                if other and any(_private(p) for p in full.split(".")):
                    found.append(f"line {node.lineno}: from {target} import {alias.name}")
                if other:
                    bound[alias.asname or alias.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound \
                and _private(node.attr):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr} ({bound[node.value.id]})")
    return found


def violations() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out += [f"{path.relative_to(PACKAGE.parent)} {use}" for use in private_uses(path.read_text(), module)]
    return out


def test_the_check_sees_each_form_of_private_use():
    source = ("from accel_kit.studies._training import all_points\n"
              "from accel_kit.studies.sparsity import _throughput_presets\n"
              "import accel_kit.studies._training\n"
              "from accel_kit.studies import sparsity\n"
              "sparsity._throughput_presets(None)\n"
              "from accel_kit import report as R\n"
              "R._browser()\n")
    assert len(private_uses(source, "accel_kit.cli")) == 5
    # within its own package, a private name is the package's own business; a dunder is public
    assert private_uses(source, "accel_kit.studies.gas") == ["line 7: R._browser (accel_kit.report)"]
    assert private_uses("from accel_kit import __version__\n", "accel_kit.report.page") == []


def test_no_module_imports_another_packages_private_names():
    found = violations()
    assert not found, "\n".join(found)
