"""Desired ingress records and their etcd representation.

A record is stored at `<records_prefix>/<authority>/<id>` as JSON, with (or, when the
ingress is split over several transactions, before) the keys it renders to, as the commit
ledger's rule says (write/ledger.py), so a restart or a second replica rebuilds the full
state from etcd. A removed ingress leaves a tombstone record (`removed`, with the removal's revision and
time): an upsert at or below the removal's revision is refused instead of resurrecting it, and a
removal split over several transactions is finished after a restart, not undone. A remove of an
ingress never stored leaves a tombstone too, of a placeholder ingress (`tombstone`). Tombstones
are dropped after `writer.tombstone_ttl`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from ..errors import RecordDecodeError
from ..ingress import Ingress, field_errors
from ..ingress.values import STORED
from ..keys import IngressRef

# Told of every committed change of a live record (None: it is gone).
RecordListener = Callable[[IngressRef, Ingress | None], None]

# The stored JSON ends with the ingress: `{"source":...[,"removed":...],"ingress":<canonical JSON>}`.
# A JSON string escapes every quote, so this text occurs once, where the ingress begins.
_INGRESS_FIELD = ',"ingress":'


def stored_value(content: str, source: str, removed: bool = False, removed_at: float = 0.0) -> str:
    """The JSON stored in etcd for the ingress of canonical JSON `content`."""
    removal = f',"removed":true,"removed_at":{removed_at!r}' if removed else ""
    return f'{{"source":{_json_text(source)}{removal}{_INGRESS_FIELD}{content}}}'


@functools.lru_cache(maxsize=1024)
def _json_text(source: str) -> str:
    # A handful of sources ("api", each ingress file): encoded once each, not once per record.
    return json.dumps(source)


@dataclass(frozen=True, slots=True)
class Record:
    """One desired ingress: the validated model, the JSON stored for it in etcd, and who declared it.

    Only the stored JSON is kept (the ingress's canonical JSON is its tail): the store and the
    mirror of etcd share that one string per ingress, after the models the largest thing
    either holds.
    """

    ingress: Ingress
    value: str
    source: str = "api"
    removed: bool = False
    removed_at: float = 0.0

    @classmethod
    def of(cls, ingress: Ingress, source: str = "api") -> Record:
        """A record for `ingress`, with its stored JSON computed once."""
        return cls(ingress, stored_value(ingress.model_dump_json(), source), source)

    @property
    def content(self) -> str:
        """The ingress's canonical JSON: two records of the same content ask for the same ingress."""
        return self.value[self.value.index(_INGRESS_FIELD) + len(_INGRESS_FIELD) : -1]

    @property
    def key(self) -> IngressRef:
        """(authority, id)."""
        return self.ingress.key

    @property
    def revision(self) -> int:
        """The coordinator's revision of this ingress."""
        return self.ingress.revision

    def removal(self, revision: int, now: float) -> Record:
        """The tombstone left when this ingress is removed at `revision`."""
        ingress = self.ingress.model_copy(update={"revision": revision})
        return Record(ingress, stored_value(ingress.model_dump_json(), self.source, True, now), self.source, True, now)


# The ingress a tombstone of an ingress never stored holds: valid, so that every version of the
# exporter reads the record as it reads any other (sidecars of two versions share etcd during a
# rolling upgrade), and never rendered (nothing renders a tombstone).
PLACEHOLDER_SERVER = "tcp://127.0.0.1:9"


def tombstone(ref: IngressRef, revision: int, now: float) -> Record:
    """The tombstone of an ingress never stored (or whose tombstone expired), removed at `revision` at time `now`."""
    placeholder = Ingress.model_validate(
        {"authority": ref.authority, "id": ref.id, "revision": revision, "protocol": "tcp",
         "upstream": {"servers": [{"url": PLACEHOLDER_SERVER}]}},
        context=STORED,
    )
    return Record.of(placeholder).removal(revision, now)


def supersedes(revision: int, removal: bool, other: Record) -> bool:
    """True when a change at the coordinator's `revision` (a removal when `removal`) replaces `other`.

    The one revision order of the exporter: a newer revision wins, and at the same revision a
    removal wins over a live record (never the other way round).
    """
    return revision > other.revision or (revision == other.revision and removal and not other.removed)


def decode_record(value: str) -> Record:
    """Parse a stored record value."""
    try:
        data = json.loads(value)
        ingress = Ingress.model_validate(data["ingress"], context=STORED)
    except ValidationError as exc:
        raise RecordDecodeError(f"stored ingress does not validate: {field_errors(exc)}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordDecodeError(f"stored record is not exporter JSON: {type(exc).__name__}") from None
    source, removed, removed_at = str(data.get("source", "api")), bool(data.get("removed", False)), float(data.get("removed_at", 0.0))
    canonical = stored_value(ingress.model_dump_json(), source, removed, removed_at)
    # The text read is kept when it is what this exporter writes: the mirror holds that same string.
    return Record(ingress, value if value == canonical else canonical, source, removed, removed_at)


@dataclass(frozen=True)
class Removal:
    """A remove request for one ingress (without a revision: whatever is stored)."""

    ref: IngressRef
    revision: int | None = None


class RecordStore:
    """The committed records (as they are in etcd), keyed by (authority, id): live ones and tombstones.

    Listeners (`add_listener`) are told of every change of a live record (the health engine
    follows the checked ingresses through it).
    """

    def __init__(self) -> None:
        self.records: dict[IngressRef, Record] = {}
        self.tombstones: dict[IngressRef, Record] = {}
        self._listeners: list[RecordListener] = []

    def add_listener(self, listener: RecordListener) -> None:
        """Tell `listener` of every change of a live record: (key, its ingress, or None when it is gone)."""
        self._listeners.append(listener)

    def __len__(self) -> int:
        return len(self.records)

    def get(self, key: IngressRef) -> Record | None:
        """The committed live record of one ingress."""
        return self.records.get(key)

    def ingress_of(self, key: IngressRef) -> Ingress | None:
        """The ingress of one committed live record (None: none)."""
        record = self.records.get(key)
        return record.ingress if record is not None else None

    def latest(self, key: IngressRef) -> Record | None:
        """The live record, else the tombstone, of one ingress."""
        return self.records.get(key) or self.tombstones.get(key)

    def set(self, key: IngressRef, record: Record | None) -> None:
        """Commit a record, a tombstone, or None (no record at all)."""
        if record is None or record.removed:
            if record is None:
                self.tombstones.pop(key, None)
            else:
                self.tombstones[key] = record
            if self.records.pop(key, None) is not None:
                for listener in self._listeners:
                    listener(key, None)
            return
        self.tombstones.pop(key, None)
        previous = self.records.get(key)
        self.records[key] = record
        if previous is None or previous.value != record.value:
            for listener in self._listeners:
                listener(key, record.ingress)

    def by_authority(self, authority: str | None = None) -> list[Record]:
        """Every live record, or those of one authority, ordered by key."""
        return [r for k, r in sorted(self.records.items()) if authority is None or k[0] == authority]
