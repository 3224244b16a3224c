"""Desired ingress records and their etcd representation.

A record is stored at `<records_prefix>/<authority>/<id>` as JSON, in the same transaction
as the keys it renders to, so a restart or a second replica rebuilds the full state from
etcd. A record marked `removing` is a tombstone: an ingress too large for one transaction
is being deleted in several, and a restart must finish that deletion, not undo it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from ..ingress import Ingress, field_errors


@dataclass(frozen=True, slots=True)
class Record:
    """One desired ingress: the validated model, its canonical JSON, and who declared it."""

    ingress: Ingress
    content: str
    source: str = "api"
    removing: bool = False

    @classmethod
    def of(cls, ingress: Ingress, source: str = "api") -> Record:
        """A record for `ingress`, with its canonical JSON computed once."""
        return cls(ingress=ingress, content=ingress.model_dump_json(), source=source)

    @property
    def key(self) -> tuple[str, str]:
        """(authority, id)."""
        return self.ingress.key

    @property
    def revision(self) -> int:
        """The coordinator's revision of this ingress."""
        return self.ingress.revision

    def to_value(self) -> str:
        """The JSON stored in etcd."""
        removing = ',"removing":true' if self.removing else ""
        return f'{{"source":{json.dumps(self.source)}{removing},"ingress":{self.content}}}'

    def tombstone(self) -> Record:
        """The same record marked as being removed."""
        return Record(self.ingress, self.content, self.source, removing=True)


def record_key(records_prefix: str, authority: str, ingress_id: str) -> str:
    """Where the record of one ingress lives."""
    return f"{records_prefix}/{authority}/{ingress_id}"


class RecordDecodeError(ValueError):
    """A stored record that does not decode (written by something else, or by an older version)."""


def decode_record(value: str) -> Record:
    """Parse a stored record value."""
    try:
        data = json.loads(value)
        ingress = Ingress.model_validate(data["ingress"])
    except ValidationError as exc:
        raise RecordDecodeError(f"stored ingress does not validate: {field_errors(exc)}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordDecodeError(f"stored record is not exporter JSON: {type(exc).__name__}") from None
    return Record(
        ingress=ingress,
        content=ingress.model_dump_json(),
        source=str(data.get("source", "api")),
        removing=bool(data.get("removing", False)),
    )


class RecordStore:
    """The committed desired records (as they are in etcd), keyed by (authority, id)."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], Record] = {}
        # Told of every committed change (the health engine follows the checked ingresses).
        self.listener: Callable[[tuple[str, str], Ingress | None], None] = lambda _key, _ingress: None

    def __len__(self) -> int:
        return len(self.records)

    def get(self, key: tuple[str, str]) -> Record | None:
        """The committed record of one ingress."""
        return self.records.get(key)

    def set(self, key: tuple[str, str], record: Record | None) -> None:
        """Commit a record (None removes it)."""
        if record is None or record.removing:
            if self.records.pop(key, None) is not None:
                self.listener(key, None)
        else:
            previous = self.records.get(key)
            self.records[key] = record
            if previous is None or previous.content != record.content:
                self.listener(key, record.ingress)

    def by_authority(self, authority: str | None = None) -> list[Record]:
        """Every record, or those of one authority, ordered by key."""
        return [r for k, r in sorted(self.records.items()) if authority is None or k[0] == authority]
