"""The commit ledger: the one owner of the rule "a record commits with, or before, its keys".

Every ingress has a record (outside Traefik's roots) and keys (under its root). The rule, and
each place it shows:
- order: a unit's record change comes first (a put, or a tombstone for a removal), a record
  delete last, once no key of it is left (`with_record`). A unit too large for one
  transaction is split in that order, so its first part carries the record: after a crash
  between parts the record says what the ingress must become, and repair finishes it;
- guards: every transaction of an ingress compares its record's mod_revision, so a stale
  writer fails and re-plans instead of overwriting newer state; the record compare is built
  here and nowhere else (`record_guard`, `next_part_guards`);
- what committed: per ingress, the revision its record committed at (the mirror's), the
  revision of the newest commit that changed its keys when that is later (the last part of a
  split, a health-driven change), and the parts of a write still in flight. What Traefik must
  have applied for an ingress to be served is `revision_of`: its last part, not its record;
- paced records (write/pacer.py): a record may commit alone, its keys later. Such a commit
  wrote nothing under the root, so it is not what Traefik must apply (`revision_of` leaves it
  out), and while keys it asked for are still unwritten the ingress `awaits_keys`.

It also keeps the revisions this writer created, so the watch tells our commits from anyone
else's without decoding them, and updates the mirror from every committed transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ..etcd.types import Compare
from ..keys import IngressRef
from .observed import Observed

if TYPE_CHECKING:  # the plan's types only: plan/ builds its guards from this module
    from ..plan.plan import Change, UnitPlan

# Own revisions remembered before the ones the watch has passed are dropped.
_OWN_KEPT = 10_000


def record_guard(record_key: str, observed_record: tuple[str, int] | None) -> Compare:
    """The compare every transaction of an ingress carries: its record is as the plan saw it (0: none)."""
    return Compare(record_key, "EQUAL", observed_record[1] if observed_record else 0)


def with_record(keys: list[Change], record: Change | None) -> list[Change]:
    """The changes of one ingress in commit order: the record put first, a record delete last."""
    if record is None:
        return keys
    return [*keys, record] if record.new is None else [record, *keys]


class CommitLedger:
    """What each ingress's commits are, the parts in flight, and this writer's own revisions."""

    def __init__(self, observed: Observed) -> None:
        observed.own = self.is_own
        self._observed = observed
        self.layout = observed.layout
        # Newest commit that changed an ingress's keys, only while it is newer than its record's.
        self._keys: dict[IngressRef, int] = {}
        # Parts of a split write not committed yet.
        self._pending: dict[IngressRef, int] = {}
        # Records that committed without their keys (the revision), and those whose keys still wait.
        self._record_only: dict[IngressRef, int] = {}
        self._awaiting: dict[IngressRef, int] = {}
        self._own: set[int] = set()
        # The newest of them (what a paused watch must have caught up with, see the mirror).
        self.newest_own = 0

    # ----- guards of a split write

    def guarded_revision(self, unit: UnitPlan) -> int:
        """The record revision `unit` was planned against (what its record guard compares)."""
        if unit.owner is None:
            return 0
        key = self.layout.record_key(unit.owner)
        return next((c.mod_revision for c in unit.compares if c.key == key and not c.prefix), 0)

    def next_part_guards(self, unit: UnitPlan, record_revision: int, previous: int) -> list[Compare]:
        """The compares of a later part: the record as the first part left it, nothing under the unit changed since `previous`."""
        compares = [Compare(self.layout.record_key(unit.owner), "EQUAL", record_revision)] if unit.owner else []
        compares += [Compare(c.key, "LESS", previous + 1, prefix=True) for c in unit.compares if c.prefix]
        return compares

    def record_changed(self, unit: UnitPlan, changes: Iterable[Change]) -> bool:
        """True when `changes` (one part of `unit`) carry the unit's record."""
        return unit.owner is not None and self.layout.record_key(unit.owner) in {c.key for c in changes}

    # ----- what committed

    def started(self, unit: UnitPlan, parts: int) -> None:
        """A write of `unit` in `parts` transactions begins."""
        if unit.owner is not None:
            self._pending[unit.owner] = parts

    def ended(self, unit: UnitPlan) -> None:
        """The write of `unit` is over (every part committed, or it stopped at a conflict or an error)."""
        if unit.owner is not None:
            self._pending.pop(unit.owner, None)

    def committed(self, units: Sequence[UnitPlan], changes: Sequence[Change], revision: int) -> None:
        """A transaction carrying `changes` (parts of `units`) committed at `revision`."""
        self._own.add(revision)
        self.newest_own = max(self.newest_own, revision)
        written = set()
        for change in changes:
            self._observed.set(change.key, change.new, revision)
            written.add(change.key)
        for unit in units:
            ref = unit.owner
            if ref is None:
                continue
            if ref in self._pending:
                self._pending[ref] -= 1
            record_key = self.layout.record_key(ref)
            if not unit.root:  # a record committed alone: its keys are as they were
                self._record_only[ref] = revision
                if unit.keys_held:
                    self._awaiting[ref] = revision
                continue
            if record_key in written:
                self._keys.pop(ref, None)
                self._record_only.pop(ref, None)
            else:
                self._keys[ref] = revision
            self._awaiting.pop(ref, None)

    def observed(self, ref: IngressRef, revision: int, *, record: bool) -> None:
        """Another writer changed the ingress (its record when `record`) at `revision`."""
        if record:
            if self._keys.get(ref, 0) <= revision:
                self._keys.pop(ref, None)
            self._record_only.pop(ref, None)
            return
        if revision > self._keys.get(ref, 0):
            self._keys[ref] = revision
        if revision > self._awaiting.get(ref, revision):
            del self._awaiting[ref]

    # ----- readers

    def record_revision(self, ref: IngressRef) -> int:
        """The etcd revision the ingress's record committed at (0: it has none)."""
        found = self._observed.record(self.layout.record_key(ref))
        return found[1] if found else 0

    def revision_of(self, ref: IngressRef) -> int:
        """The revision of the ingress's last commit under its root: its record's, or a later one that changed only its keys.

        A record that committed alone (paced) wrote nothing Traefik reads: it does not count.
        """
        newest_key = self._observed.newest_mod(ref)
        record = self.record_revision(ref)
        if self._record_only.get(ref) == record:
            record = 0
        return max(record, self._keys.get(ref, 0), newest_key)

    def awaits_keys(self, ref: IngressRef) -> bool:
        """True when the ingress's record committed alone and the keys it asked for are not written yet."""
        return ref in self._awaiting

    def keys_written(self, ref: IngressRef) -> None:
        """The ingress's keys are as its record renders (found so, with nothing to write)."""
        self._awaiting.pop(ref, None)

    def pending(self, ref: IngressRef) -> int:
        """Parts of the ingress's write in flight that have not committed yet."""
        return self._pending.get(ref, 0)

    # ----- own revisions

    def is_own(self, revision: int) -> bool:
        """True when `revision` was created by one of this writer's transactions."""
        return revision in self._own

    def own_run(self, after: int) -> int:
        """The newest revision `r` such that every revision in (`after`, `r`] is one of this writer's commits."""
        revision = after
        while revision + 1 in self._own:
            revision += 1
        return revision

    def forget_until(self, revision: int) -> None:
        """Forget own revisions up to `revision` (the watch has seen them all)."""
        if len(self._own) > _OWN_KEPT:
            self._own = {r for r in self._own if r > revision}
