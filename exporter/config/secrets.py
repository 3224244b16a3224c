"""Secrets in the settings: a value from the environment, or a file that holds it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from ..errors import ConfigError


def read_secret(path: Path, field: str) -> str | None:
    """A secret from a file (stripped; None when empty); a ConfigError naming the field if unreadable."""
    try:
        return path.read_text().strip() or None
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read {path}: {exc.strerror}") from None


@dataclass(frozen=True)
class SecretSource:
    """Where one secret comes from: `value` (the environment) wins over `file`; `field` names the file's setting in errors."""

    field: str
    file: Path | None
    value: SecretStr | None = None

    def read(self) -> str | None:
        """The secret (None: not configured); read when asked, so a rotated file is picked up."""
        if self.value is not None:
            return self.value.get_secret_value()
        return read_secret(self.file, self.field) if self.file is not None else None
