"""The package stays easy to change: no class over 250 lines, no function over 50 (issue 10's rule)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "exporter"


def _sizes() -> list[tuple[int, str, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                out.append((node.end_lineno - node.lineno + 1, kind, f"{path.relative_to(PACKAGE.parent)}:{node.name}"))
    return out


def test_no_class_over_250_lines_and_no_function_over_50() -> None:
    too_big = [(n, kind, where) for n, kind, where in _sizes() if n > (250 if kind == "class" else 50)]
    assert too_big == []
