"""Pack plan units into etcd transactions (pure; no I/O).

Units that fit are packed whole, several to a transaction, within `max_ops` operations,
`max_ops` compares and `max_bytes`; a group of units (one push request) is kept in one
transaction whenever it fits. A unit too large for one transaction is split into a
sequence of chunks in its change order: every prefix of that sequence leaves no router
referencing a missing object (plan/guards.py), the first chunk carries the record (the
commit ledger's rule, write/ledger.py) and every later chunk puts it again, unchanged, so
that each part moves the record's revision. Every transaction also rewrites the beacon of each root it touches (one more
operation per root, counted here).

Shared objects (render/shared.py): a unit that newly references one finds it in the same
transaction or compares it present. Those written for the units of a plan (`shared`) go into
the first transaction that needs each; a later transaction that needs it compares it present
and is sent only after that one (`Txn.after`). A shared object no packed unit needs is not written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..etcd.types import Compare
from ..plan.plan import Change, UnitPlan

_TXN_OVERHEAD = 256


@dataclass(slots=True, eq=False)
class Txn:
    """One transaction: the units it completes, and the changes and compares it carries."""

    units: list[UnitPlan] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    compares: list[Compare] = field(default_factory=list)
    bytes: int = _TXN_OVERHEAD
    # The roots whose keys it changes: it rewrites their beacons.
    roots: set[str] = field(default_factory=set)
    # Shared objects it needs present (compares on each one's witness key), on every part of a split.
    requires: list[Compare] = field(default_factory=list)
    # Transactions that write shared objects it needs: sent once they are done.
    after: list[Txn] = field(default_factory=list)

    def add(self, unit: UnitPlan, size: int) -> None:
        """Carry all of `unit`."""
        self.units.append(unit)
        self.changes.extend(unit.changes)
        # One range compare is enough for several units that carry it (orphans of one root): etcd
        # reads every key of a range compare, each time it is sent.
        self.compares.extend(c for c in unit.compares if not c.prefix or c not in self.compares)
        self.bytes += size
        self.roots |= _roots([unit])

    def require(self, compares: Sequence[Compare], after: Sequence[Txn]) -> None:
        """Compare these shared objects present; send only after `after`."""
        self.requires.extend(c for c in compares if c not in self.requires)
        self.after.extend(t for t in after if t is not self and all(t is not a for a in self.after))


def _roots(units: Sequence[UnitPlan]) -> set[str]:
    return {u.root for u in units if u.root}


def _size(changes: Sequence[Change]) -> int:
    return sum(len(c.key) * 2 + len(c.new or "") for c in changes) * 4 // 3 + 48 * len(changes)


def _present(witness: str) -> Compare:
    return Compare(witness, "GREATER", 0)


@dataclass(slots=True)
class _Needs:
    """What one unit needs in a given transaction: shared units to carry, presence compares, earlier transactions."""

    carry: list[UnitPlan] = field(default_factory=list)
    compares: list[Compare] = field(default_factory=list)
    after: list[Txn] = field(default_factory=list)


class _Packer:
    def __init__(self, max_ops: int, max_bytes: int, shared: Mapping[str, UnitPlan]) -> None:
        self.max_ops, self.max_bytes, self.shared = max_ops, max_bytes, shared
        self.txns: list[Txn] = []
        self.split: list[list[Txn]] = []
        self.current = Txn()
        # Where each shared object of `shared` is written.
        self.placed: dict[str, Txn] = {}

    def needs(self, txn: Txn, units: Sequence[UnitPlan]) -> _Needs:
        out = _Needs()
        carried: set[str] = set()
        for unit in units:
            for path, witness in unit.needs:
                at = self.placed.get(path)
                if at is txn or path in carried:
                    continue
                if at is None and path in self.shared:
                    out.carry.append(self.shared[path])
                    carried.add(path)
                    continue
                out.compares.append(_present(witness))
                if at is not None:
                    out.after.append(at)
        return out

    def fits(self, txn: Txn, units: Sequence[UnitPlan], size: int) -> bool:
        needs = self.needs(txn, units)
        every = [*needs.carry, *units]
        beacons = len(txn.roots | _roots(every))
        return (
            len(txn.changes) + sum(len(u.changes) for u in every) + beacons <= self.max_ops
            and len(txn.compares) + len(txn.requires) + sum(len(u.compares) for u in units) + len(needs.compares) <= self.max_ops
            and txn.bytes + size + sum(_size(u.changes) for u in needs.carry) <= self.max_bytes
        )

    def add(self, unit: UnitPlan, size: int) -> None:
        if self.current.units and not self.fits(self.current, [unit], size):
            self.close()
        txn = self.current
        needs = self.needs(txn, [unit])
        for shared in needs.carry:  # before the unit: a prefix of the changes never names a missing object
            txn.add(shared, _size(shared.changes))
            self.placed[shared.shared] = txn
        txn.add(unit, size)
        txn.require(needs.compares, needs.after)

    def close(self) -> None:
        if self.current.units:
            self.txns.append(self.current)
        self.current = Txn()

    def oversized(self, unit: UnitPlan) -> None:
        needs = self.needs(Txn(), [unit])
        if needs.carry:  # written first, in a transaction of their own
            creator = Txn()
            for shared in needs.carry:
                creator.add(shared, _size(shared.changes))
                self.placed[shared.shared] = creator
            self.txns.append(creator)
            needs = self.needs(Txn(), [unit])
        chunks = _split(unit, self.max_ops, self.max_bytes)
        for chunk in chunks:
            chunk.require(needs.compares, needs.after)
        self.split.append(chunks)


def pack(
    groups: Sequence[Sequence[UnitPlan]], max_ops: int, max_bytes: int, shared: Mapping[str, UnitPlan] | None = None
) -> tuple[list[Txn], list[list[Txn]]]:
    """Return (whole-unit txns, one chunk sequence per oversized unit).

    `shared`: the shared objects' units by path, written with the first transaction that needs each.
    """
    packer = _Packer(max_ops, max_bytes, shared or {})
    for group in groups:
        whole: list[tuple[UnitPlan, int]] = []
        for unit in group:
            size = _size(unit.changes)
            if packer.fits(Txn(), [unit], size):
                whole.append((unit, size))
            else:
                packer.oversized(unit)
        current = packer.current
        if current.units and not packer.fits(current, [u for u, _ in whole], sum(size for _, size in whole)):
            packer.close()
        for unit, size in whole:
            packer.add(unit, size)
    packer.close()
    return packer.txns, packer.split


def _split(unit: UnitPlan, max_ops: int, max_bytes: int) -> list[Txn]:
    roots = _roots([unit])
    max_ops -= len(roots)
    again = _record_again(unit)
    first = next((c for c in unit.changes if again is not None and c.key == again.key), again)
    chunks: list[Txn] = []
    for change in unit.changes:
        if again is not None and change.key == again.key:
            continue  # every chunk carries it
        size = _size([change])
        current = chunks[-1] if chunks else None
        if current is None or (len(current.changes) > (again is not None) and (
            len(current.changes) >= max_ops or current.bytes + size > max_bytes
        )):
            record = first if not chunks else again
            current = Txn(units=[unit], roots=set(roots), changes=[record] if record else [])
            current.bytes += _size([record]) if record else 0
            chunks.append(current)
        current.changes.append(change)
        current.bytes += size
    return chunks


def _record_again(unit: UnitPlan) -> Change | None:
    """The put of the unit's record as its first part leaves it, for every part to carry (None: it has no record).

    Each part then moves the record's mod_revision: a peer that planned against a mirror holding
    some parts and not the rest fails its record compare, instead of planning from half the keys.
    """
    if not unit.record_key or unit.record is None:
        return None
    put = next((c for c in unit.changes if c.key == unit.record_key), None)
    if put is not None and put.new is None:
        return None  # the record goes last: nothing follows it
    value = put.new if put is not None and put.new is not None else unit.record.value
    return Change(unit.record_key, value, value)
