"""Loading the settings: the YAML file, then the environment, then paths resolved against the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsConfigDict

from ..errors import ConfigError
from .paths import resolve_paths
from .schema import Settings


def load_settings(path: Path | None, **overrides: Any) -> Settings:
    """Load settings from `path` (YAML) and the environment; relative paths resolve against the file."""
    if path is None:
        settings = _build(Settings, **overrides)
        base = Path.cwd()
    else:
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        settings = _build(_from_file(path), **overrides)
        base = path.resolve().parent
    resolve_paths(settings, base)
    return settings


def _from_file(path: Path) -> type[Settings]:
    """A settings model of its own for one load, naming its YAML file (nothing shared between loads)."""

    class FromFile(Settings):
        model_config = SettingsConfigDict(**{**Settings.model_config, "yaml_file": path})

    return FromFile


def _build(model: type[Settings], **overrides: Any) -> Settings:
    from ..ingress import field_errors

    try:
        return model(**overrides)
    except ValidationError as exc:
        errors = field_errors(exc)
        detail = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors)
        raise ConfigError(f"invalid configuration: {detail}", {"errors": errors}) from None
    except ValueError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
