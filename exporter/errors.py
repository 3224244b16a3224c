"""The one exception hierarchy of the exporter.

Each class means one thing a caller can act on; the push API maps them one-to-one
onto its JSON error `type` and HTTP status (see docs/api.md).
"""

from __future__ import annotations

from typing import Any


class ExporterError(Exception):
    """Base class. `status` is the HTTP status the push API answers with."""

    status = 500

    def __init__(self, title: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(title)
        self.title = title
        self.data: dict[str, Any] = data or {}

    @property
    def type_name(self) -> str:
        """The `type` field of the JSON error body."""
        return type(self).__name__

    def to_json(self) -> dict[str, Any]:
        """The JSON error body: `{"type", "title", "data"}`."""
        return {"type": self.type_name, "title": self.title, "data": self.data}


class ValidationFailed(ExporterError):
    """Input did not validate; `data.errors` lists every field error."""

    status = 400


class Unauthorized(ExporterError):
    """Missing or wrong bearer token."""

    status = 401


class StaleRevisionError(ExporterError):
    """A revision lower than the stored one, or the same revision with other content."""

    status = 409


class BodyTooLarge(ExporterError):
    """The request body is over the configured limit."""

    status = 413


class UnsupportedMediaType(ExporterError):
    """The request body is not JSON."""

    status = 415


class EtcdUnavailable(ExporterError):
    """etcd could not be reached or did not answer in time; nothing was written."""

    status = 503


class TemplateError(ExporterError):
    """An ingress renders (through the templates) to something Traefik would reject; nothing is written."""

    status = 400


class ConfigError(ExporterError):
    """The exporter's own configuration is invalid."""

    status = 500
