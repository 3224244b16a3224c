"""The package stays easy to change: no class over 250 lines, no function over 50; one owner for the commit rule."""

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


def _record_compares() -> list[str]:
    """Where a `Compare` on a record key is built: the first argument names a record."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Compare" and node.args:
                first = ast.get_source_segment(source, node.args[0]) or ""
                if "record" in first.lower():
                    out.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return out


def test_only_the_commit_ledger_builds_a_record_compare() -> None:
    where = _record_compares()
    assert where and all(w.startswith("exporter/write/ledger.py:") for w in where), where
