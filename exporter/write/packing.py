"""Pack plan units into etcd transactions (pure; no I/O).

Units that fit are packed whole, several to a transaction, within `max_ops` operations,
`max_ops` compares and `max_bytes`; a group of units (one push request) is kept in one
transaction whenever it fits. A unit too large for one transaction is split into a
sequence of chunks in its change order: every prefix of that sequence leaves no router
referencing a missing object (plan/guards.py), and the first chunk carries the record
(the commit ledger's rule, write/ledger.py). Every transaction also rewrites the beacon of each root it touches (one more
operation per root, counted here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..etcd.types import Compare
from ..plan.plan import Change, UnitPlan

_TXN_OVERHEAD = 256


@dataclass(slots=True)
class Txn:
    """One transaction: the units it completes, and the changes and compares it carries."""

    units: list[UnitPlan] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    compares: list[Compare] = field(default_factory=list)
    bytes: int = _TXN_OVERHEAD
    # The roots whose keys it changes: it rewrites their beacons.
    roots: set[str] = field(default_factory=set)

    def add(self, unit: UnitPlan, size: int) -> None:
        """Carry all of `unit`."""
        self.units.append(unit)
        self.changes.extend(unit.changes)
        self.compares.extend(unit.compares)
        self.bytes += size
        self.roots |= _roots([unit])


def _roots(units: Sequence[UnitPlan]) -> set[str]:
    return {u.root for u in units if u.root}


def _size(changes: Sequence[Change]) -> int:
    return sum(len(c.key) * 2 + len(c.new or "") for c in changes) * 4 // 3 + 48 * len(changes)


def pack(groups: Sequence[Sequence[UnitPlan]], max_ops: int, max_bytes: int) -> tuple[list[Txn], list[list[Txn]]]:
    """Return (whole-unit txns, one chunk sequence per oversized unit)."""
    txns: list[Txn] = []
    split: list[list[Txn]] = []
    current = Txn()

    def fits(txn: Txn, units: Sequence[UnitPlan], size: int) -> bool:
        beacons = len(txn.roots | _roots(units))
        return (
            len(txn.changes) + sum(len(u.changes) for u in units) + beacons <= max_ops
            and len(txn.compares) + sum(len(u.compares) for u in units) <= max_ops
            and txn.bytes + size <= max_bytes
        )

    for group in groups:
        whole: list[tuple[UnitPlan, int]] = []
        for unit in group:
            size = _size(unit.changes)
            if fits(Txn(), [unit], size):
                whole.append((unit, size))
            else:
                split.append(_split(unit, max_ops, max_bytes))
        if current.units and not fits(current, [u for u, _ in whole], sum(size for _, size in whole)):
            txns.append(current)
            current = Txn()
        for unit, size in whole:
            if current.units and not fits(current, [unit], size):
                txns.append(current)
                current = Txn()
            current.add(unit, size)
    if current.units:
        txns.append(current)
    return txns, split


def _split(unit: UnitPlan, max_ops: int, max_bytes: int) -> list[Txn]:
    chunks: list[Txn] = []
    roots = _roots([unit])
    max_ops -= len(roots)
    current = Txn(units=[unit], roots=set(roots))
    for change in unit.changes:
        size = _size([change])
        if current.changes and (len(current.changes) >= max_ops or current.bytes + size > max_bytes):
            chunks.append(current)
            current = Txn(units=[unit], roots=set(roots))
        current.changes.append(change)
        current.bytes += size
    chunks.append(current)
    return chunks
