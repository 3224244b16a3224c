"""etcd's limits per transaction, detected instead of assumed.

A transaction made only of compares writes nothing and creates no revision, and etcd checks
`--max-txn-ops` against its compares too (etcd 3.5): probing with such transactions finds the
operation limit without touching anything. Such a transaction is read-only, so it never meets
`--max-request-bytes` (a raft proposal's bound) but does meet the gRPC message bound etcd derives
from it (`--max-request-bytes` + 512 KiB), which etcd's error names: `grpc: received
message larger than max (<sent> vs. <max>)` (over either transport). docs/operations.md has the limits to set for large
roots, and what they cost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import EtcdError
from .store import EtcdStore
from .types import Compare

# Probed up to these: more per transaction is of no use to the writer.
MAX_OPS_PROBED = 100_000
MAX_BYTES_PROBED = 16 * 1024 * 1024
# etcd's gRPC bound is --max-request-bytes plus this.
_GRPC_OVERHEAD = 512 * 1024
_LARGER_THAN_MAX = re.compile(r"larger than max \((\d+) vs\. (\d+)\)")


@dataclass(frozen=True)
class EtcdLimits:
    """What one transaction may carry: operations (and, separately, compares), and bytes."""

    max_txn_ops: int
    max_request_bytes: int


def _too_many(exc: EtcdError) -> bool:
    return "too many operations" in exc.title


async def _accepts(etcd: EtcdStore, key: str, compares: int) -> bool:
    try:
        await etcd.txn([Compare(key, "EQUAL", 0, target="CREATE")] * compares, [])
    except EtcdError as exc:
        if _too_many(exc) or exc.status == 429:
            return False
        raise
    return True


async def detect_txn_ops(etcd: EtcdStore, key: str) -> int:
    """The most compares (so operations) one transaction may carry, up to MAX_OPS_PROBED."""
    # A one-byte key: 100,000 compares must stay below the message bound, whatever the bound.
    key = key[:1]
    low, high = 1, MAX_OPS_PROBED + 1  # low accepted, high refused
    for guess in (129, MAX_OPS_PROBED):  # etcd's default is 128: usually two probes
        if await _accepts(etcd, key, guess):
            low = guess
        else:
            high = guess
            break
    if low == MAX_OPS_PROBED:
        return low
    while high - low > 1:
        middle = (low + high) // 2
        if await _accepts(etcd, key, middle):
            low = middle
        else:
            high = middle
    return low


async def detect_request_bytes(etcd: EtcdStore, key: str) -> int:
    """etcd's --max-request-bytes as its gRPC bound tells it (at most MAX_BYTES_PROBED)."""
    for size in (2 * 1024 * 1024 + 1024, MAX_BYTES_PROBED + _GRPC_OVERHEAD + 1024):
        try:
            await etcd.txn([Compare(key + "x" * size, "EQUAL", 0, target="CREATE")], [])
        except EtcdError as exc:
            found = _LARGER_THAN_MAX.search(exc.title)
            if exc.status == 429 and found:
                return max(int(found.group(2)) - _GRPC_OVERHEAD, 64 * 1024)
            raise
    return MAX_BYTES_PROBED


async def detect_limits(etcd: EtcdStore, key: str) -> EtcdLimits:
    """Both limits, probed with compare-only transactions on `key` (which need not exist)."""
    return EtcdLimits(await detect_txn_ops(etcd, key), await detect_request_bytes(etcd, key))
