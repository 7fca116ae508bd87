"""The parallel layout is declared once: ``accel_kit.mesh.ParallelLayout`` alone declares the degrees (tp, pp, cp,
ep) as fields of a class, and the data-parallel degree, devices over tp x pp x cp, is computed there alone (read
from the source, as tests/test_code_shape.py reads it)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "accel_kit"
DEGREES = {"tp", "pp", "cp", "ep"}
HOME = "accel_kit/mesh.py"


def _modules() -> list[tuple[str, ast.Module]]:
    return [(path.relative_to(PACKAGE.parent).as_posix(), ast.parse(path.read_text()))
            for path in sorted(PACKAGE.rglob("*.py"))]


def degree_fields(modules: list[tuple[str, ast.Module]]) -> list[str]:
    """``path:line Class.field`` of every class-level declaration of a degree (annotated or assigned)."""
    found = []
    for where, tree in modules:
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                targets = [stmt.target] if isinstance(stmt, ast.AnnAssign) else getattr(stmt, "targets", [])
                found += [f"{where}:{stmt.lineno} {cls.name}.{t.id}" for t in targets
                          if isinstance(t, ast.Name) and t.id in DEGREES]
    return found


def _names(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, (ast.Name, ast.Attribute))}


def dp_arithmetic(modules: list[tuple[str, ast.Module]]) -> list[str]:
    """``path:line`` of every division (or remainder) by a product of tp, pp and cp: the data-parallel degree
    computed, or its divisibility checked; and of every ``dp`` (or ``data_parallel_size``) a class defines."""
    found = []
    for where, tree in modules:
        for node in ast.walk(tree):
            if (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Div, ast.Mod))
                    and isinstance(node.right, ast.BinOp) and {"tp", "pp", "cp"} <= _names(node.right)):
                found.append(f"{where}:{node.lineno} divides by tp x pp x cp")
            if isinstance(node, ast.ClassDef):
                found += [f"{where}:{f.lineno} {node.name}.{f.name}" for f in node.body
                          if isinstance(f, ast.FunctionDef) and f.name in ("dp", "data_parallel_size")]
    return found


def test_the_checks_see_what_they_look_for():
    sample = [("x.py", ast.parse("class A:\n    tp: int = 1\n    ep = 1\n\n"
                                 "class B:\n    def dp(self):\n        return self.devices // (self.tp * self.pp * self.cp)\n"))]
    assert degree_fields(sample) == ["x.py:2 A.tp", "x.py:3 A.ep"]
    assert sorted(dp_arithmetic(sample)) == ["x.py:6 B.dp", "x.py:7 divides by tp x pp x cp"]


def test_only_the_parallel_layout_declares_the_degrees():
    found = degree_fields(_modules())
    home = [f for f in found if f.startswith(f"{HOME}:") and " ParallelLayout." in f]
    assert len(home) == len(DEGREES), found  # ParallelLayout's own, each once
    assert sorted(set(found) - set(home)) == [], "declare the layout once: hold or inherit accel_kit.mesh.ParallelLayout"


def test_the_data_parallel_degree_is_computed_in_one_place():
    found = dp_arithmetic(_modules())
    assert [f for f in found if f.startswith(f"{HOME}:")] == [f"{HOME}:{_line_of_dp()} ParallelLayout.dp"], found
    assert [f for f in found if not f.startswith(f"{HOME}:")] == [], "use ParallelLayout.dp (accel_kit/mesh.py)"


def _line_of_dp() -> int:
    tree = ast.parse((PACKAGE / "mesh.py").read_text())
    layout = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ParallelLayout")
    return next(f.lineno for f in layout.body if isinstance(f, ast.FunctionDef) and f.name == "dp")
