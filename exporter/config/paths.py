"""Paths in the settings: each one marked relative to the config file, all resolved by one walk."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel


class RelativeToConfig:
    """Marks a settings field whose relative paths resolve against the config file's directory."""


RELATIVE = RelativeToConfig()
# A file or directory; a glob of files.
ConfigPath = Annotated[Path, RELATIVE]
ConfigGlob = Annotated[str, RELATIVE]


def _marked(annotation: Any) -> bool:
    """True when `annotation` (possibly inside an Optional or a list) carries the marker."""
    if typing.get_origin(annotation) is Annotated:
        return any(isinstance(m, RelativeToConfig) for m in annotation.__metadata__)
    return any(_marked(arg) for arg in typing.get_args(annotation))


def _resolved(value: Any, base: Path) -> Any:
    if isinstance(value, list):
        return [_resolved(v, base) for v in value]
    if isinstance(value, Path):
        return value if value.is_absolute() else base / value
    if isinstance(value, str):
        return value if Path(value).is_absolute() else str(base / value)
    return value


def resolve_paths(model: BaseModel, base: Path) -> None:
    """Resolve every marked field of `model` and of its sections against `base`, in place."""
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            resolve_paths(value, base)
        elif value is not None and (_marked(info.annotation) or any(isinstance(m, RelativeToConfig) for m in info.metadata)):
            setattr(model, name, _resolved(value, base))
