"""Flatten validated Traefik objects into Traefik's etcd key layout (no I/O).

List indices are zero-padded to the width of the list's upper bound, because Traefik's
decoder sorts indices as strings (`10` sorts before `2`) and order matters for servers
and middlewares. Fields left unset are not written at all.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from annotated_types import MaxLen
from pydantic import BaseModel


@cache
def _list_widths(model: type[BaseModel]) -> dict[str, int]:
    widths: dict[str, int] = {}
    for name, info in model.model_fields.items():
        for meta in info.metadata:
            if isinstance(meta, MaxLen):
                widths[name] = len(str(max(meta.max_length - 1, 0)))
    return widths


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _walk(value: Any, prefix: str, width: int, out: dict[str, str]) -> None:
    if isinstance(value, BaseModel):
        widths = _list_widths(type(value))
        for name in type(value).model_fields:
            child = getattr(value, name)
            if child is not None:
                _walk(child, f"{prefix}/{name}", widths.get(name, 1), out)
    elif isinstance(value, dict):
        for name, child in value.items():
            _walk(child, f"{prefix}/{name}", 1, out)
    elif isinstance(value, list):
        for index, child in enumerate(value):
            _walk(child, f"{prefix}/{index:0{width}d}", 1, out)
    else:
        out[prefix] = _scalar(value)


def flatten(obj: BaseModel, root: str) -> dict[str, str]:
    """Every leaf of `obj` as `{"<root>/<path>": "<value>"}`."""
    out: dict[str, str] = {}
    _walk(obj, root, 1, out)
    return out
