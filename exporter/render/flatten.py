"""Flatten validated Traefik objects into Traefik's etcd key layout (no I/O).

List indices are zero-padded to the width of the list's upper bound, because Traefik's
decoder sorts indices as strings (`10` sorts before `2`) and order matters for servers
and middlewares. Fields left unset are not written at all.
"""

from __future__ import annotations

import sys
from typing import Any

from annotated_types import MaxLen
from pydantic import BaseModel

from . import traefik_schema


def _list_widths() -> dict[str, int]:
    # Width of each list field's indices, by field name, from the schema's `max_length`s.
    widths: dict[str, int] = {}
    for model in vars(traefik_schema).values():
        if isinstance(model, type) and issubclass(model, BaseModel) and model is not BaseModel:
            for name, info in model.model_fields.items():
                for meta in info.metadata:
                    if isinstance(meta, MaxLen):
                        width = len(str(max(meta.max_length - 1, 0)))
                        widths[name] = max(widths.get(name, 1), width)
    return widths


_WIDTHS = _list_widths()


def _walk(value: Any, prefix: str, out: dict[str, str]) -> None:
    for name, child in value.items():
        key = f"{prefix}/{name}"
        if isinstance(child, dict):
            _walk(child, key, out)
        elif isinstance(child, list):
            width = _WIDTHS.get(name, 1)
            for index, item in enumerate(child):
                item_key = f"{key}/{index:0{width}d}"
                if isinstance(item, dict):
                    _walk(item, item_key, out)
                else:
                    out[item_key] = _scalar(item)
        else:
            out[key] = _scalar(child)


def _scalar(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return value
    # Numbers (weights, priorities, limits) take few distinct values: interned, 10,000 ingresses
    # hold each once, not once per key.
    return sys.intern(str(value))


def flatten(obj: BaseModel | dict[str, Any], root: str) -> dict[str, str]:
    """Every leaf of `obj` (unset fields left out) as `{"<root>/<path>": "<value>"}`.

    `obj` is a validated model, or its `model_dump(exclude_none=True)`.
    """
    out: dict[str, str] = {}
    _walk(obj if isinstance(obj, dict) else obj.model_dump(exclude_none=True), root, out)
    return out
