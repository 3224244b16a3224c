"""The observed mirror kept equal to etcd: paged re-lists, watches, deferred events, peer records.

Everything under the roots and the records prefix is mirrored into `Observed` (what plans
diff against) and the committed records into the `RecordStore`. Watch events of our own
transactions are recognised by revision without decoding (store/own.py keeps them; the
commit ledger is told of everyone else's commits); events that arrive while our
transactions are in flight wait until they are done. Keys someone else changed flag their
ingress as drifted (`on_drift`), or, in a shared object (render/shared.py), ask for a full pass,
which repairs the shared objects in use (`on_stale(relist=False)`); a watch etcd cancels asks
for a re-list (`on_stale(relist=True)`).

The watches themselves (and their pause during a bulk of our own writes) are in watches.py.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Sequence

from loguru import logger

from ..errors import RecordDecodeError
from ..etcd.store import EtcdStore
from ..etcd.types import WatchEvent
from ..keys import IngressRef, KeyLayout
from ..plan.plan import UnitPlan
from ..store.observed import Observed
from ..store.records import RecordStore, decode_record
from ..supervisor import Supervisor
from ..write.ledger import CommitLedger
from ..write.writer import Writer
from .watches import Watches


class Mirror:
    """Reads etcd into `observed` and `store`; the writer's own commits are told apart from others'."""

    def __init__(
        self,
        etcd: EtcdStore,
        layout: KeyLayout,
        observed: Observed,
        store: RecordStore,
        writer: Writer,
        ledger: CommitLedger,
        *,
        on_drift: Callable[[Sequence[IngressRef]], None],
        on_stale: Callable[[bool], None],
        idle_timeout: float = 60.0,
        supervisor: Supervisor | None = None,
    ) -> None:
        self._etcd = etcd
        self._layout = layout
        self._observed = observed
        self._store = store
        self._writer = writer
        self._ledger = ledger
        self._on_drift = on_drift
        self._on_stale = on_stale
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self._deferred: list[tuple[list[WatchEvent], bool]] = []
        self._draining: asyncio.Task[None] | None = None
        self.watches = Watches(
            etcd, layout, observed, self._on_events, lambda: on_stale(True), idle_timeout=idle_timeout, supervisor=self._supervisor
        )

    async def relist(self) -> None:
        """Rebuild the mirror and the committed records from a paged read."""
        roots = await self._etcd.range_prefix(self._layout.roots_prefix)
        records = await self._etcd.range_prefix(self._layout.records_dir, revision=roots.revision)
        self._observed.load(
            ((kv.key, kv.value, kv.mod_revision) for kv in itertools.chain(roots.kvs, records.kvs)), roots.revision
        )
        listed = {self.adopt_record(kv.key, kv.value) for kv in records.kvs}
        for ref in [r for r in [*self._store.records, *self._store.tombstones] if r not in listed]:
            self._store.set(ref, None)
        self.watches.relisted(roots.revision)
        logger.info("listed etcd at revision {}: {} records, {} keys", roots.revision, len(records.kvs), len(roots.kvs))

    def adopt_record(self, key: str, value: str | None) -> IngressRef | None:
        """Take a record read from etcd (None: deleted) into the store; returns its ingress."""
        ref = self._layout.record_ref(key)
        if ref is None:
            return None
        self._layout.object_label(ref.authority)  # its objects are now recognised by name
        if value is None:
            self._store.set(ref, None)
            return ref
        try:
            record = decode_record(value)
        except RecordDecodeError as exc:
            logger.error("ignoring record {}: {}", key, exc.title)
            return None
        if record.key != ref:
            logger.error("ignoring record {}: it holds ingress {}", key, record.key)
            return None
        self._store.set(ref, record)
        return ref

    async def refresh(self, units: Iterable[UnitPlan]) -> None:
        """Re-read what conflicted units guard (each object whole), adopting any record a peer wrote meanwhile.

        Every read is pinned to one revision, so the mirror takes from it only what it does not
        know newer (our commits and watch events may land while the reads are out).
        """
        # The reads are pinned at the revision of the first answer, no older than what both
        # watches have delivered now: the deletions after that stay known until they are in.
        observed = self._observed
        with observed.deletions.held(min(observed.keys_seen, observed.records_seen)):
            await self._reread(units)

    async def _reread(self, units: Iterable[UnitPlan]) -> None:
        revision = 0
        for unit in units:
            for obj in [*unit.objects, *(path for path, _witness in unit.needs)]:
                page = await self._etcd.range_prefix(obj + "/", revision=revision)
                revision = page.revision
                self._observed.replace_object(obj, page.kvs, revision)
            for compare in unit.compares:
                if compare.prefix or any(compare.key.startswith(obj + "/") for obj in unit.objects):
                    continue  # read with its object above
                found, revision = await self._etcd.get_at(compare.key, revision)
                value = found.value if found else None
                taken = self._observed.observe(compare.key, value, found.mod_revision if found else revision)
                if taken and unit.owner is not None and compare.key == self._layout.record_key(unit.owner):
                    self.adopt_record(compare.key, value)

    async def stop(self) -> None:
        """Stop watching, and applying deferred events."""
        await self.watches.stop()
        if self._draining is not None:
            self._draining.cancel()
            await asyncio.gather(self._draining, return_exceptions=True)

    def _on_events(self, events: list[WatchEvent], roots: bool) -> None:
        if self._writer.busy:
            # Our own transactions are in flight: their events are recognised by revision once
            # the replies are in, without decoding them.
            self._deferred.append((events, roots))
            if self._draining is None or self._draining.done():
                self._draining = self._supervisor.spawn("deferred events", self._drain_deferred)
            return
        self.apply_events(events, roots=roots)

    async def _drain_deferred(self) -> None:
        while self._deferred:
            await self._writer.wait_idle()
            deferred, self._deferred = self._deferred, []
            for events, roots in deferred:
                self.apply_events(events, roots=roots)

    def apply_events(self, events: Sequence[WatchEvent], *, roots: bool = False) -> None:
        """Mirror events from a watch; ingresses someone else changed are reported as drifted.

        `roots`: the events are a message of the roots' watch, which delivers every write under
        the roots in revision order, so the mirror then holds every key written up to the last.
        """
        changed: set[IngressRef] = set()
        for event in events:
            if event.mod_revision <= self._observed.revision or event.mod_revision in self._observed.own:
                continue  # already known, or written by us (a txn is one revision)
            ref = self._apply_event(event)
            if ref is not None:
                changed.add(ref)
        if events:
            newest = max(e.mod_revision for e in events)
            if roots:
                self._observed.keys_seen = max(self._observed.keys_seen, newest)
            else:
                self._observed.records_seen = max(self._observed.records_seen, newest)
            # Both watches are past these deletions: no older put of their keys can arrive now.
            self._observed.deletions.forget_through(min(self._observed.keys_seen, self._observed.records_seen))
        if changed:
            self._on_drift(sorted(changed))

    def _apply_event(self, event: WatchEvent) -> IngressRef | None:
        key, value = event.key, event.value
        if not self._observed.observe(key, value, event.mod_revision):
            return None  # our own write, already applied, or older than what a later commit or read left
        if self._writer.is_writing(key, value):
            return None  # our own transaction, seen before its reply
        if key.startswith(self._layout.records_dir):
            ref = self.adopt_record(key, value)
            if ref is not None:
                self._ledger.observed(ref, event.mod_revision, record=True)
            return ref
        # Peers (other sidecars) write these keys too: only a repair is worth an INFO line.
        logger.debug("key {} changed by another writer at revision {}", key, event.mod_revision)
        ref = self._layout.owner_of_key(key)
        if ref is not None:
            self._ledger.observed(ref, event.mod_revision, record=False)
        elif (obj := self._layout.object_of(key)) is not None and self._layout.is_shared(obj):
            self._on_stale(False)
        return ref
