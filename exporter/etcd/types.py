"""The values exchanged with etcd: keys read, compares, operations, txn results, watch events.

Shared by the gateway client and anything else that implements `EtcdStore` (the in-memory
fake in the tests); encoding follows etcd's v3 JSON gateway (base64 keys and values).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import orjson

from .proto import kv_pb2


def b64(data: str) -> str:
    """`data` as the gateway carries it."""
    return binascii.b2a_base64(data.encode(), newline=False).decode("ascii")


def unb64(data: str | None) -> str:
    """The text of a base64 gateway field (empty when absent)."""
    return base64.b64decode(data).decode() if data else ""


def range_end(prefix: str) -> bytes:
    """The `range_end` that selects every key under `prefix`."""
    raw = bytearray(prefix.encode())
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\x00"


def b64_range_end(prefix: str) -> str:
    """The base64 `range_end` that selects every key under `prefix`."""
    return base64.b64encode(range_end(prefix)).decode()


class KeyValue(NamedTuple):
    """One key as read from etcd."""

    key: str
    value: str
    mod_revision: int
    create_revision: int


class Compare(NamedTuple):
    """A txn guard on a key's mod_revision (or create_revision with `target="CREATE"`).

    `prefix=True` compares every key under `key` (one range compare).
    """

    key: str
    result: Literal["EQUAL", "LESS", "GREATER", "NOT_EQUAL"]
    mod_revision: int
    prefix: bool = False
    target: Literal["MOD", "CREATE"] = "MOD"

    def json(self) -> str:
        """This compare as gateway JSON (base64 needs no escaping: the text is built directly)."""
        field = "mod_revision" if self.target == "MOD" else "create_revision"
        end = f',"range_end":"{b64_range_end(self.key)}"' if self.prefix else ""
        return f'{{"key":"{b64(self.key)}","target":"{self.target}","result":"{self.result}","{field}":"{self.mod_revision}"{end}}}'


class Op(NamedTuple):
    """A txn operation: put `value` at `key` (attached to `lease` if set), or delete `key` when `value` is None."""

    key: str
    value: str | None
    lease: int = 0

    def json(self) -> str:
        """This operation as gateway JSON."""
        if self.value is None:
            return f'{{"request_delete_range":{{"key":"{b64(self.key)}"}}}}'
        lease = f',"lease":"{self.lease}"' if self.lease else ""
        return f'{{"request_put":{{"key":"{b64(self.key)}","value":"{b64(self.value)}"{lease}}}}}'


def txn_body(compares: Sequence[Compare], ops: Sequence[Op]) -> bytes:
    """The body of a gateway `/v3/kv/txn` request: the hot path of every write, so it is built as text."""
    return ('{"compare":[' + ",".join(c.json() for c in compares) + '],"success":[' + ",".join(o.json() for o in ops) + "]}").encode()


@dataclass(slots=True)
class TxnResult:
    """The outcome of a txn: `succeeded` False means a compare failed and nothing was applied."""

    succeeded: bool
    revision: int


class WatchLine:
    """One message of a watch stream, decoded only when one of its events is looked into.

    The exporter's own transactions come back on its watches; recognising them by revision
    (read without decoding the message) saves decoding most of what a bulk sync writes.
    """

    __slots__ = ("_events", "_raw")

    def __init__(self, raw: bytes) -> None:
        self._raw = raw
        self._events: list[dict[str, Any]] | None = None

    def event(self, index: int) -> dict[str, Any]:
        """The index-th event of the message, as the gateway wrote it."""
        if self._events is None:
            self._events = orjson.loads(self._raw)["result"]["events"]
        return self._events[index]


class WatchEvent:
    """One key change seen by a watch; decoded only when its key, value or kind is asked for.

    Its source: a gateway message and the event's index in it, an event of a gRPC watch
    response (protobuf decodes a field when it is read), or a decoded event (tests, tools).
    """

    __slots__ = ("_source", "mod_revision")

    def __init__(self, kv: dict[str, Any] | tuple[WatchLine, int] | kv_pb2.Event, mod_revision: int, deleted: bool = False) -> None:
        # A dict is the decoded kv (`{"kv": ..., "type": ...}` shape built here).
        self._source: dict[str, Any] | tuple[WatchLine, int] | kv_pb2.Event = (
            {"kv": kv, "type": "DELETE" if deleted else "PUT"} if isinstance(kv, dict) else kv
        )
        self.mod_revision = mod_revision

    @classmethod
    def of(cls, key: str, value: str | None, mod_revision: int) -> WatchEvent:
        """An event from decoded values (a put of `value`, or a delete when None)."""
        kv = {"key": b64(key)} if value is None else {"key": b64(key), "value": b64(value)}
        return cls(kv, mod_revision, value is None)

    def _event(self) -> dict[str, Any]:
        source = self._source
        if isinstance(source, dict):
            return source
        assert isinstance(source, tuple)
        line, index = source
        return line.event(index)

    @property
    def deleted(self) -> bool:
        """True for a delete."""
        if isinstance(self._source, kv_pb2.Event):
            return self._source.type == kv_pb2.Event.DELETE
        return bool(self._event().get("type") == "DELETE")

    @property
    def key(self) -> str:
        """The key that changed."""
        if isinstance(self._source, kv_pb2.Event):
            return self._source.kv.key.decode()
        return unb64(self._event()["kv"]["key"])

    @property
    def value(self) -> str | None:
        """The new value, or None for a delete."""
        if isinstance(self._source, kv_pb2.Event):
            return None if self._source.type == kv_pb2.Event.DELETE else self._source.kv.value.decode()
        event = self._event()
        return None if event.get("type") == "DELETE" else unb64(event["kv"].get("value"))


@dataclass
class RangePage:
    """The result of a (paged) range read, pinned to one revision."""

    kvs: list[KeyValue] = field(default_factory=list)
    revision: int = 0


def kv_of(raw: dict[str, Any]) -> KeyValue:
    """A KeyValue from the gateway's JSON."""
    return KeyValue(
        key=unb64(raw["key"]),
        value=unb64(raw.get("value")),
        mod_revision=int(raw.get("mod_revision", 0)),
        create_revision=int(raw.get("create_revision", 0)),
    )
