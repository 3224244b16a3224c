"""The commit ledger: the stateful half of the rule "a record commits with, or before, its keys".

The order and the guards of every transaction are the rule's pure half (plan/guards.py).
This keeps what committed:
- per ingress, the revision its record committed at (the mirror's), the revision of the
  newest commit that changed its keys when that is later (the last part of a split, a
  health-driven change), and the parts of a write still in flight. What Traefik must have
  applied for an ingress to be served is `revision_of`: its last part, not its record;
- paced records (write/pacer.py): a record may commit alone, its keys later. Such a commit
  wrote nothing under the root, so it is not what Traefik must apply (`revision_of` leaves it
  out), and while keys it asked for are still unwritten the ingress `awaits_keys`.

Every committed transaction is kept as one of our own commits (store/own.py) until the watch
delivers its revision: the mirror then applies it from what was written, without decoding
it, and reports none of it as drift. Until then an ingress's last commit (`unseen`) is newer
than the mirror, and nothing plans it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..keys import IngressRef
from ..plan.plan import Change, UnitPlan
from ..store.observed import Observed
from ..store.own import OwnCommit, OwnCommits
from ..store.records import Record


class CommitLedger:
    """What each ingress's commits are and the parts in flight."""

    def __init__(self, observed: Observed) -> None:
        self._observed = observed
        self.layout = observed.layout
        # Newest commit that changed an ingress's keys, only while it is newer than its record's.
        self._keys: dict[IngressRef, int] = {}
        # Parts of a split write not committed yet.
        self._pending: dict[IngressRef, int] = {}
        # Records that committed without their keys (the revision), and those whose keys still wait.
        self._record_only: dict[IngressRef, int] = {}
        self._awaiting: dict[IngressRef, int] = {}
        # Our commits the watch has not delivered yet, and each ingress's last commit.
        self.own = OwnCommits()
        self._last: dict[IngressRef, int] = {}

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
        """A transaction carrying `changes` (parts of `units`) committed at `revision`.

        Every transaction of ours puts a key (a beacon, or a record), so `revision` is its own:
        etcd answers a transaction that changes nothing with the revision before it.
        """
        written = {change.key: change.new for change in changes}
        records: dict[IngressRef, Record | None] = {}
        for unit in units:
            ref = unit.owner
            if ref is None:
                continue
            self._last[ref] = max(revision, self._last.get(ref, 0))
            if unit.record_key in written:
                new = written[unit.record_key]
                if unit.record is None or unit.record.value == new:
                    records[ref] = unit.record if new is not None else None
            if ref in self._pending:
                self._pending[ref] -= 1
            if not unit.root:  # a record committed alone: its keys are as they were
                self._record_only[ref] = revision
                if unit.keys_held:
                    self._awaiting[ref] = revision
                continue
            if unit.record_key in written:
                self._keys.pop(ref, None)
                self._record_only.pop(ref, None)
            else:
                self._keys[ref] = revision
            self._awaiting.pop(ref, None)
        if revision > self._observed.revision:
            self.own.add(revision, OwnCommit([(c.key, c.new) for c in changes], records))

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

    def unseen(self, ref: IngressRef) -> int:
        """The revision of the ingress's last commit when the mirror has not reached it yet (0: it has)."""
        last = self._last.get(ref, 0)
        if last and last <= self._observed.revision:
            del self._last[ref]
            return 0
        return last

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
