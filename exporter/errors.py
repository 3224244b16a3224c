"""The one exception tree of the exporter: every error it raises is an `ExporterError`.

Each class means one thing a caller can act on. Domain code never knows HTTP: the push
API maps these classes onto statuses in one table (`sources/api.py`), the CLI onto exit
codes.
"""

from __future__ import annotations

from typing import Any


class ExporterError(Exception):
    """Base class: a one-line `title` and structured `data` (both safe to show; never a secret)."""

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


class Unauthorized(ExporterError):
    """Missing or wrong bearer token."""


class StaleRevisionError(ExporterError):
    """A revision lower than the stored one, or the same revision with other content."""


class BodyTooLarge(ExporterError):
    """The request body is over the configured limit."""


class UnsupportedMediaType(ExporterError):
    """The request body is not JSON."""


class TemplateError(ExporterError):
    """An ingress renders (through the templates) to something Traefik would reject; nothing is written."""


class ConfigError(ExporterError):
    """The exporter's own configuration is invalid."""


class RecordDecodeError(ExporterError):
    """A stored record that does not decode (written by something else, or by an older version)."""


class NotServedInTime(ExporterError):
    """The change is committed, but Traefik did not serve it within `api.served_timeout`."""


class TraefikUnreachable(ExporterError):
    """Traefik's API did not answer (or answered with an error)."""


class EtcdError(ExporterError):
    """etcd failed or could not be reached. `unavailable` is True for connection-level failures.

    One subtree for every way etcd lets a caller down (the push API answers 503 for all of it):
    `EtcdUnavailable` when a request was not committed because of it, `WatchCanceled` when etcd
    ended a watch.
    """

    def __init__(self, message: str, *, unavailable: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.unavailable = unavailable
        self.status = status


class EtcdUnavailable(EtcdError):
    """A request could not be committed because etcd is unreachable (or kept changing); nothing of it was written."""

    def __init__(self, message: str) -> None:
        super().__init__(message, unavailable=True)


class WatchCanceled(EtcdError):
    """The watch was canceled by etcd; `compact_revision` is set when history was compacted."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision
