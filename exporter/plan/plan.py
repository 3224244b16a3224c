"""The plan: what must change in etcd, computed without side effects, printable, then applied.

`diff`, `run --dry-run` and the writer share this one type, so what operators read is
exactly what the writer applies. Each unit is one ingress (or one root's own keys) with the
compares that guard it: the record's mod_revision, so a concurrent or stale writer fails and
re-plans instead of overwriting; and, while the mirror may not hold the keys committed with
that record yet, one range compare per object subtree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..etcd.types import Compare
from ..keys import IngressRef
from ..store.records import Record
from ..write.ledger import record_guard, with_record


class Change(NamedTuple):
    """One key change: `old` None means added, `new` None means removed."""

    key: str
    old: str | None
    new: str | None

    @property
    def sign(self) -> str:
        """`+`, `-` or `~`."""
        return "+" if self.old is None else "-" if self.new is None else "~"


@dataclass(slots=True)
class UnitPlan:
    """The changes of one ingress (`owner` set) or of one root's own keys (`owner` None).

    `changes` are in a safe order for splitting: router deletes, other puts, router puts,
    other deletes (so no router ever references a missing object), with the record placed
    as the commit ledger's rule says (write/ledger.py: its put first, its delete last).
    """

    name: str
    changes: list[Change]
    compares: list[Compare]
    owner: IngressRef | None = None
    record: Record | None = None
    removed: bool = False
    # The root the unit's keys are under (its transactions rewrite that root's beacon); empty
    # for a record committed alone (write/pacer.py), which writes nothing under the root.
    root: str = ""
    # A record committed alone whose key changes were held back for later.
    keys_held: bool = False
    # The object subtrees (paths) the ingress's keys are in, observed or desired: what a conflict re-reads.
    objects: tuple[str, ...] = ()


@dataclass(slots=True)
class Plan:
    """Every unit that differs, and the foreign keys seen under managed roots."""

    units: list[UnitPlan] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """True when nothing needs writing."""
        return not self.units

    def changes(self) -> list[Change]:
        """Every change of every unit, in plan order."""
        return [c for unit in self.units for c in unit.changes]


def order_changes(changes: list[Change]) -> list[Change]:
    """Order key changes so that every prefix of the list leaves no router referencing a missing object.

    Router deletes, other puts, router puts, other deletes (one pass: this runs for every
    ingress of a bulk sync).
    """
    router_del: list[Change] = []
    other_put: list[Change] = []
    router_put: list[Change] = []
    other_del: list[Change] = []
    for change in changes:
        if "/routers/" in change.key:
            (router_del if change.new is None else router_put).append(change)
        else:
            (other_del if change.new is None else other_put).append(change)
    return router_del + other_put + router_put + other_del


def plan_ingress(
    *,
    owner: IngressRef,
    desired: dict[str, str] | None,
    observed_objects: dict[str, dict[str, tuple[str, int]]],
    desired_objects: tuple[str, ...],
    record_key: str,
    desired_record: Record | None,
    observed_record: tuple[str, int] | None,
    root: str = "",
    keys_current: bool = False,
) -> UnitPlan | None:
    """Diff one ingress: `desired` keys (None: remove it) against what etcd holds for it.

    `keys_current`: the observed keys include every key committed with the observed record.
    """
    want = desired or {}
    observed_keys = {key: value for keys in observed_objects.values() for key, (value, _mod) in keys.items()}
    if observed_keys:
        changes = [Change(key, observed_keys.get(key), value) for key, value in want.items() if observed_keys.get(key) != value]
        changes += [Change(key, value, None) for key, value in observed_keys.items() if key not in want]
    else:  # nothing of it in etcd yet (every ingress of a bulk sync)
        changes = [Change(key, None, value) for key, value in want.items()]
    record_value = desired_record.value if desired_record is not None else None
    old_record = observed_record[0] if observed_record else None
    record = Change(record_key, old_record, record_value) if record_value != old_record else None
    if not changes and record is None:
        return None
    guarded = sorted(set(observed_objects) if observed_record is None else set(observed_objects) | set(desired_objects))
    return UnitPlan(
        name=str(owner),
        changes=with_record(order_changes(changes), record),
        compares=_guards(record_key, observed_record, observed_objects, guarded, keys_current),
        owner=owner,
        record=desired_record,
        removed=desired is None,
        root=root,
        objects=tuple(guarded),
    )


def _guards(
    record_key: str, observed_record: tuple[str, int] | None,
    observed_objects: dict[str, dict[str, tuple[str, int]]], guarded: list[str], keys_current: bool,
) -> list[Compare]:
    """The compares of one ingress's transaction.

    The record guards against every other exporter: each writes the record with the keys
    it renders to (write/ledger.py), so a stale plan fails on it. A range compare per object
    is added only while the mirror may hold the record but not the keys committed with it:
    the records and the roots are two watches, so a peer's record can arrive before its
    keys, and a plan against the older keys would leave the peer's keys beside ours. Once
    the roots' watch has delivered past the record's commit (or it is our own), the record
    compare alone guards the ingress. etcd reads every key of every range compare on every
    transaction (a third of a push transaction's etcd CPU, docs/performance.md); keys changed
    meanwhile without a new record (a foreign writer, the leader's health rewrite) are seen
    by the watch and planned again like any drift, as they are for a brand-new ingress (no
    record anywhere), which never needs one.
    """
    compares = [record_guard(record_key, observed_record)]
    if observed_record is not None and keys_current:
        return compares
    for obj in guarded:
        keys = observed_objects.get(obj, {})
        newest = max((mod for _v, mod in keys.values()), default=0)
        compares.append(Compare(obj + "/", "LESS", newest + 1, prefix=True))
        if keys and observed_record is not None:
            # etcd passes a range compare on keys deleted meanwhile (an empty range is "less"):
            # one key of each object as observed catches a peer's removal of the object.
            first = min(keys)
            compares.append(Compare(first, "EQUAL", keys[first][1]))
    return compares


def plan_root(
    root: str, desired: dict[str, str], observed: dict[str, tuple[str, int]], keep_existing: frozenset[str]
) -> UnitPlan | None:
    """Diff one root's own keys; keys in `keep_existing` (a generated certificate) are only created."""
    changes = []
    compares = []
    for key, value in desired.items():
        seen = observed.get(key)
        if seen is None:
            changes.append(Change(key, None, value))
        elif seen[0] != value and key not in keep_existing:
            changes.append(Change(key, seen[0], value))
        else:
            continue
        compares.append(Compare(key, "EQUAL", seen[1] if seen else 0))
    if not changes:
        return None
    return UnitPlan(name=f"root {root}", changes=changes, compares=compares, root=root)
