"""A `TxnRequest` in protobuf's wire format, written directly: the hot path of every write.

Building the messages field by field costs about four times the bytes it produces (35 us for a
one-compare, nine-put transaction against 9 us for its JSON); the encoding of the few fields the
exporter sets is short, and a property test holds it byte for byte to protobuf's own.
"""

from __future__ import annotations

from collections.abc import Sequence

from .types import Compare, Op, range_end

_RESULT = {"EQUAL": 0, "GREATER": 1, "LESS": 2, "NOT_EQUAL": 3}
_TARGET = {"CREATE": 1, "MOD": 2}


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 as protobuf writes it: ten bytes of two's complement
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _compare(c: Compare) -> bytes:
    # result (1) and target (2) are omitted at 0 as proto3 does; the revision is in a oneof, so it
    # is written even at 0 (etcd tells CREATE == 0 from no compare by it).
    out = bytearray()
    if result := _RESULT[c.result]:
        out += b"\x08" + _varint(result)
    out += b"\x10" + _varint(_TARGET[c.target])
    out += _field(3, c.key.encode())
    out += (b"\x28" if c.target == "CREATE" else b"\x30") + _varint(c.mod_revision)
    if c.prefix:
        out += _field(64, range_end(c.key))
    return bytes(out)


def _op(o: Op) -> bytes:
    key = _field(1, o.key.encode())
    if o.value is None:
        return _field(3, key)
    put = key + _field(2, o.value.encode()) if o.value else key
    if o.lease:
        put += b"\x18" + _varint(o.lease)
    return _field(2, put)


def txn_request(compares: Sequence[Compare], ops: Sequence[Op]) -> bytes:
    """The serialized `etcdserverpb.TxnRequest` of `compares` and `ops` (as success)."""
    return b"".join([*(_field(1, _compare(c)) for c in compares), *(_field(2, _op(o)) for o in ops)])
