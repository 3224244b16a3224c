"""Field paths of the ingress model: every one it has (`field_paths`), and those a given ingress sets
(`set_paths`). Inside an upstream a path names its kind (`upstream[servers].servers.url`)."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel

from exporter.ingress import AiProxyMultiUpstream, PluginUpstream, ServersUpstream

KINDS: dict[type[BaseModel], str] = {ServersUpstream: "servers", AiProxyMultiUpstream: "ai-proxy-multi", PluginUpstream: "plugin"}


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _has_value(annotation: Any) -> bool:
    """True when the field can hold a value that is not a model (a leaf, or `tls: true`)."""
    if annotation is type(None) or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        args = args[:1]
    return not args or any(_has_value(a) for a in args)


def field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every field path of `model` that holds a value, nested models walked; inside an upstream, `[kind]` names it."""
    out = []
    for name, field in model.model_fields.items():
        path = prefix + name
        if _has_value(field.annotation):
            out.append(path)
        for sub in _models(field.annotation):
            marker = f"[{KINDS[sub]}]" if sub in KINDS else ""
            out.extend(field_paths(sub, f"{path}{marker}."))
    return out


def set_paths(model: BaseModel, prefix: str = "") -> set[str]:
    """The field paths `model` was given a value for (defaults left out), nested models and lists of them walked."""
    out: set[str] = set()
    for name in model.model_fields_set:
        path, value = prefix + name, getattr(model, name)
        models = [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, BaseModel)]
        if not models:
            out.add(path)
        for sub in models:
            marker = f"[{KINDS[type(sub)]}]" if type(sub) in KINDS else ""
            out |= set_paths(sub, f"{path}{marker}.")
    return out
