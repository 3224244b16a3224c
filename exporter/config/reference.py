"""The configuration reference (docs/configuration.md), generated from the settings' models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from .schema import Settings


def reference_markdown() -> str:
    """The configuration reference (docs/configuration.md), generated from the models above."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from `exporter/config/` by `traefik-etcd-exporter config-reference`; a test",
        "fails when this file is stale. Every field can be set in `exporter.yaml` or from the",
        "environment as `EXPORTER_<SECTION>__<FIELD>` (lists and objects as JSON); the environment",
        "wins. Relative paths are relative to the config file.",
        "",
        "| field | env | default | meaning |",
        "|---|---|---|---|",
    ]

    def default_of(info: Any) -> str:
        if info.default_factory is not None:
            value = info.default_factory()
            return "" if isinstance(value, BaseModel) else f"`{value!r}`"
        return f"`{info.default!r}`" if info.default is not None else ""

    def rows(model: type[BaseModel], path: list[str]) -> None:
        for name, info in model.model_fields.items():
            annotation = info.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                rows(annotation, [*path, name])
                continue
            field, env = ".".join([*path, name]), "EXPORTER_" + "__".join(p.upper() for p in [*path, name])
            lines.append(f"| `{field}` | `{env}` | {default_of(info)} | {info.description or ''} |")

    rows(Settings, [])
    return "\n".join(lines) + "\n"
