"""The shape the code keeps: no function in the package over about 80 lines (a function that long holds
several steps that want names of their own)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "accel_kit"
MAX_LINES = 80


def long_functions(limit: int = MAX_LINES) -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_the_check_sees_long_functions():
    assert long_functions(limit=10), "no function over 10 lines found: the check reads nothing"


def test_no_function_over_80_lines():
    assert not long_functions(), "\n".join(long_functions())
