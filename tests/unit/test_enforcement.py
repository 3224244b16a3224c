"""The enforcement table (tests/enforcement.py) covers every field of the ingress model, for each
protocol and upstream kind, and cites tests that exist."""

from __future__ import annotations

import ast
import typing
from functools import cache
from typing import Any

from pydantic import BaseModel

from exporter.ingress import AiProxyMultiUpstream, Ingress, PluginUpstream, ServersUpstream
from tests.enforcement import NOT_YET_MEASURED, TABLE
from tests.helpers import REPO
from tests.model_paths import KINDS, field_paths


def _minimal(protocol: str, kind: str) -> dict[str, Any]:
    url = "http://127.0.0.1:9" if protocol == "http" else "tcp://127.0.0.1:9"
    upstream = {"servers": {"servers": [{"url": url}]},
                "ai-proxy-multi": {"kind": "ai-proxy-multi", "instances": [{"name": "a", "url": url}]},
                "plugin": {"kind": "tcp-connect", "servers": [{"url": url}]}}[kind]
    return {"authority": "a", "id": "x", "revision": 1, "protocol": protocol, "hosts": ["x.test"] if protocol == "http" else [],
            "upstream": upstream}


def _accepted(protocol: str, kind: str) -> bool:
    try:
        Ingress.model_validate(_minimal(protocol, kind))
    except ValueError:
        return False
    return True


PROTOCOLS: tuple[str, ...] = typing.get_args(Ingress.model_fields["protocol"].annotation)
COMBOS = [f"{p}/{k}" for p in PROTOCOLS for k in KINDS.values()]
ACCEPTED = [c for c in COMBOS if _accepted(*c.split("/"))]


def required_cells(path: str) -> set[str]:
    """The protocol/kind columns a row must fill: its kind's under an upstream, else every accepted combination."""
    for kind in KINDS.values():
        if f"[{kind}]" in path:
            return {f"{p}/{kind}" for p in PROTOCOLS}
    return set(ACCEPTED)


def missing(model: type[BaseModel]) -> list[str]:
    """What the table lacks for `model`: rows, then cells, each named by its path."""
    out = []
    for path in field_paths(model):
        row = TABLE.get(path)
        if row is None:
            out.append(f"{path}: no row in tests/enforcement.py")
            continue
        out += [f"{path} [{cell}]: no cell" for cell in sorted(required_cells(path) - set(row))]
    return out


@cache
def _tests_in(module: str) -> tuple[frozenset[str], bool]:
    tree = ast.parse((REPO / module).read_text())
    names = frozenset(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_"))
    integration = "pytest.mark.integration" in (REPO / module).read_text()
    return names, integration


def test_every_field_has_a_row_with_a_cell_for_each_protocol_and_kind() -> None:
    assert ACCEPTED == ["http/servers", "http/ai-proxy-multi", "http/plugin", "tcp/servers"]
    assert missing(Ingress) == []


def test_no_row_names_a_field_that_does_not_exist_and_no_cell_a_column_that_cannot_be() -> None:
    paths = set(field_paths(Ingress))
    assert sorted(set(TABLE) - paths) == []
    assert sorted(NOT_YET_MEASURED.keys() - paths) == []
    for path, row in TABLE.items():
        assert set(row) <= required_cells(path), path


def test_each_combination_an_ingress_cannot_take_is_refused_at_its_kind() -> None:
    for combo in sorted(set(COMBOS) - set(ACCEPTED)):
        kind = combo.split("/")[1]
        for prefix in ("upstream", "canary.upstream"):
            assert TABLE[f"{prefix}[{kind}].kind"][combo].where == "refused", (prefix, combo)


def test_every_cited_test_exists_and_each_traefik_cell_cites_a_test_on_the_real_traefik() -> None:
    for path, row in TABLE.items():
        for column, cell in row.items():
            assert cell.tests, (path, column)
            for test in cell.tests:
                module, _, name = test.partition("::")
                assert name in _tests_in(module)[0], f"{path} [{column}]: {test} does not exist"
            if cell.where == "traefik":
                assert any(_tests_in(t.partition("::")[0])[1] for t in cell.tests), f"{path} [{column}]: no integration test"


def test_a_field_added_without_a_row_fails_naming_its_path() -> None:
    class Later(ServersUpstream):
        sticky: bool | None = None

    class Extended(Ingress):
        upstream: Later | AiProxyMultiUpstream | PluginUpstream
        mirror_percent: int | None = None

    KINDS[Later] = "servers"
    try:
        assert missing(Extended) == [
            "upstream[servers].sticky: no row in tests/enforcement.py",
            "mirror_percent: no row in tests/enforcement.py",
        ]
    finally:
        del KINDS[Later]
