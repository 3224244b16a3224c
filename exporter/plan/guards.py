"""The commit rule, its pure half: a record commits with, or before, its keys.

Every ingress has a record (outside Traefik's roots) and keys (under its root). This module
says, for a planned unit, in what order its changes go and what guards each transaction;
write/ledger.py keeps the stateful half (what committed, parts in flight). Nothing else
builds a compare on a record key (tests/unit/test_structure.py checks that by what is called).

- order: router deletes, other puts, router puts, other deletes, so that every prefix of the
  list leaves no router referencing a missing object; the record put first and a record
  delete last (`with_record`). A unit too large for one transaction is split in that order,
  so its first part carries the record: after a crash between parts the record says what the
  ingress must become, and repair finishes it;
- guards: every transaction that changes an ingress's keys puts its record too (again,
  unchanged, when only keys change: a health rewrite, a repair, each later part of a split
  write), so the record's mod_revision is the revision of the ingress's last change. Every
  transaction of an ingress compares it (`record_guard`): a plan made against a mirror older
  than any change of the ingress fails and is made again, instead of writing beside keys it
  never saw. The mirror is etcd at one revision, records and keys alike, so this one compare
  guards the whole ingress; only a foreign writer changes keys without it, and the watch
  brings that as drift. A later part compares the record as the previous part left it
  (`next_part_guards`);
- pacing: a record may commit alone, its keys later (`record_alone`): it writes nothing under
  the root, so Traefik has nothing to apply.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..etcd.types import Compare
from .plan import Change, UnitPlan


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


def with_record(keys: list[Change], record: Change | None) -> list[Change]:
    """The changes of one ingress in commit order: the record put first, a record delete last."""
    if record is None:
        return keys
    return [*keys, record] if record.new is None else [record, *keys]


def record_guard(record_key: str, observed_record: tuple[str, int] | None) -> Compare:
    """The compare every transaction of an ingress carries: its record is as the plan saw it (0: none)."""
    return Compare(record_key, "EQUAL", observed_record[1] if observed_record else 0)


def guarded_revision(unit: UnitPlan) -> int:
    """The record revision `unit` was planned against (what its record guard compares)."""
    return next((c.mod_revision for c in unit.compares if c.key == unit.record_key and not c.prefix), 0)


def next_part_guards(unit: UnitPlan, record_revision: int) -> list[Compare]:
    """The compares of a later part: the record as the first part left it."""
    return [Compare(unit.record_key, "EQUAL", record_revision)] if unit.record_key else []


def carries_record(unit: UnitPlan, changes: Iterable[Change]) -> bool:
    """True when `changes` (one part of `unit`) carry the unit's record."""
    return bool(unit.record_key) and any(c.key == unit.record_key for c in changes)


def record_alone(unit: UnitPlan, *, keys_held: bool) -> UnitPlan | None:
    """The unit's record change alone, guarded by its own compare: nothing under the root changes (None: no record change)."""
    record = [c for c in unit.changes if c.key == unit.record_key]
    if not record:
        return None
    return UnitPlan(
        name=unit.name, changes=record, compares=[c for c in unit.compares if c.key == unit.record_key], owner=unit.owner,
        record_key=unit.record_key, record=unit.record, removed=unit.removed, keys_held=keys_held,
    )
