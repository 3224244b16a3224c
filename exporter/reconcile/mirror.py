"""The mirror: etcd as it was at one known revision R, the only thing plans diff against.

It changes in two ways only: a listing pinned at L (then R = L), or one whole revision r > R
from the watch, applied in order (reconcile/feed.py); a revision at or below R means the feed
is broken, and the mirror is listed again. Nothing else writes it: our own transactions come
back through the watch like anyone's, recognised by revision (write/ledger.py keeps them from
their reply) and applied from what was written, without decoding. The committed records
(`RecordStore`) derive from it.

Keys someone else changed flag their ingress as drifted (`on_drift`), or, in a shared object
(render/shared.py), ask for a full pass (`on_stale(relist=False)`); a canceled watch asks for
a listing (`on_stale(relist=True)`).

Callers wait for the mirror instead of reading etcd again: `reached(w)` until R >= w (an
ingress whose last commit is w), `settled(...)` after a conflict until R reaches the failed
transaction's header revision or the mirror shows a compared key changed. Every wait is
bounded: one that runs out lists again, logged and counted with its reason.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loguru import logger

from ..errors import RecordDecodeError
from ..etcd.store import EtcdStore
from ..etcd.types import WatchEvent
from ..keys import IngressRef, KeyLayout
from ..metrics import Metrics
from ..plan.plan import UnitPlan
from ..store.observed import Observed
from ..store.own import OwnCommit
from ..store.records import RecordStore, decode_record
from ..supervisor import Supervisor
from ..write.ledger import CommitLedger
from ..write.writer import Writer
from .feed import Feed

# How long a wait for the mirror may last before it is listed again.
WAIT_TIMEOUT = 10.0


@dataclass(frozen=True)
class MirrorSummary:
    """What `GET /v1/mirror` answers: the revision, the prefixes held, the key count and the digest
    (and the listing's generation the revision is of)."""

    revision: int
    prefixes: tuple[str, ...]
    keys: int
    digest: str
    generation: int


class Mirror:
    """Keeps `observed` and `store` equal to etcd at one revision."""

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
        wait_timeout: float = WAIT_TIMEOUT,
        supervisor: Supervisor | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._etcd = etcd
        self._layout = layout
        self._observed = observed
        self._store = store
        self._writer = writer
        self._ledger = ledger
        self._on_drift = on_drift
        self._on_stale = on_stale
        self._wait_timeout = wait_timeout
        self._metrics = metrics if metrics is not None else Metrics()
        self._metrics.mirror_revision.read_from(lambda: [((), float(observed.revision))])
        self._prefixes = (layout.roots_prefix, layout.records_dir)
        self._moved = asyncio.Event()
        self._reason = "requested"
        self.feed = Feed(
            etcd, layout, deliver=self._deliver, position=lambda: observed.revision,
            on_canceled=functools.partial(self.request_relist, "compacted"), idle_timeout=idle_timeout,
            supervisor=supervisor if supervisor is not None else Supervisor(),
        )
        log_range(self.feed.low, self.feed.high, self._prefixes)

    @property
    def revision(self) -> int:
        """R: the etcd revision the mirror is a copy of."""
        return self._observed.revision

    def start(self) -> None:
        """Follow etcd through the watch from each listing on."""
        self.feed.start()

    async def stop(self) -> None:
        """Stop watching."""
        await self.feed.stop()

    def request_relist(self, reason: str) -> None:
        """Ask the write loop for a listing, counted under `reason`."""
        self._reason = reason
        self._on_stale(True)

    async def relist(self, reason: str | None = None) -> None:
        """Rebuild the mirror and the committed records from a paged read pinned at one revision; a new generation starts."""
        reason = reason or self._reason
        self._reason = "requested"
        roots = await self._etcd.range_prefix(self._layout.roots_prefix)
        records = await self._etcd.range_prefix(self._layout.records_dir, revision=roots.revision)
        self._observed.load(
            ((kv.key, kv.value, kv.mod_revision) for kv in itertools.chain(roots.kvs, records.kvs)), roots.revision
        )
        listed = {adopt_record(self._layout, self._store, kv.key, kv.value) for kv in records.kvs}
        for ref in [r for r in [*self._store.records, *self._store.tombstones] if r not in listed]:
            self._store.set(ref, None)
        self._ledger.own.forget_through(roots.revision)
        generation = self.feed.listed()
        self._metrics.mirror_relists.labels(reason).inc()
        self._advanced()
        logger.info(
            "listed etcd at revision {} ({}, generation {}): {} records, {} keys",
            roots.revision, reason, generation, len(records.kvs), len(roots.kvs),
        )

    def summary(self) -> MirrorSummary:
        """The revision, the prefixes, the key count and the digest, all from one step (no await in between)."""
        return MirrorSummary(self._observed.revision, self._prefixes, len(self._observed), self._observed.digest(), self.feed.generation)

    # ----- waiting for the mirror

    async def reached(self, revision: int, reason: str = "stalled") -> None:
        """Return once R >= `revision` (listing again, as `reason`, if the watch does not get there in time)."""
        await self._wait(lambda: self._observed.revision >= revision, reason, revision)

    async def settled(self, units: Sequence[UnitPlan], revision: int, fenced_out: Callable[[], bool]) -> None:
        """After `units` lost a compare that etcd evaluated at `revision`: return once the mirror can tell why.

        That is once R >= `revision`, or the mirror already shows one of their compared keys
        (or a shared object they need) changed; or, for a fenced write, once leadership is lost.
        """
        compares = [c for u in units for c in u.compares if not c.prefix and c.target == "MOD" and c.result == "EQUAL"]
        witnesses = [witness for u in units for _path, witness in u.needs]
        get = self._observed.get

        def mod(key: str) -> int:
            found = get(key)
            return found[1] if found is not None else 0

        def changed() -> bool:
            if self._observed.revision >= revision or fenced_out():
                return True
            return any(mod(c.key) != c.mod_revision for c in compares) or any(get(w) is None for w in witnesses)

        await self._wait(changed, "conflict", revision)

    async def _wait(self, done: Callable[[], bool], reason: str, revision: int) -> None:
        try:
            async with asyncio.timeout(self._wait_timeout):
                while not done():
                    await self._moved.wait()
        except TimeoutError:
            logger.warning(
                "the mirror stayed at revision {} for {:.0f}s short of revision {}: listing etcd again",
                self._observed.revision, self._wait_timeout, revision,
            )
            await self.relist(reason)

    def _advanced(self) -> None:
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    # ----- the watch

    async def _deliver(self, generation: int, events: list[WatchEvent]) -> bool:
        # A revision that may be ours is applied once a reply says so, or every transaction that
        # could have made it is answered.
        revisions = {e.mod_revision for e in events}
        own = self._ledger.own
        await self._writer.replies_in(lambda: all(r in own for r in revisions))
        if generation != self.feed.generation:
            return True  # a listing replaced the mirror meanwhile: this message is of the past
        return self.apply(events)

    def apply(self, events: Sequence[WatchEvent]) -> bool:
        """Apply one watch message (whole revisions, in order); False (and a listing asked for) when it is out of order."""
        changed: set[IngressRef] = set()
        try:
            for revision, group in itertools.groupby(events, key=lambda e: e.mod_revision):
                if revision <= self._observed.revision:
                    logger.error("the watch sent revision {} after {}: listing etcd again", revision, self._observed.revision)
                    self.request_relist("out-of-order")
                    return False
                own = self._ledger.own.take(revision)
                if own is not None:
                    self._apply_own(own, revision)
                else:
                    self._apply_others(list(group), revision, changed)
                self._observed.revision = revision
        finally:
            if events:
                self._advanced()
            if changed:
                self._on_drift(sorted(changed))
        return True

    def _apply_own(self, own: OwnCommit, revision: int) -> None:
        records_dir = self._layout.records_dir
        for key, value in own.changes:
            self._observed.set(key, value, revision)
            if key.startswith(records_dir):
                ref = self._layout.record_ref(key)
                if ref is not None and (record := own.records.get(ref)) is not None:
                    # The record's own ref, whose strings its model holds: the parsed one would be a second copy per ingress.
                    self._store.set(record.key, record)
                else:
                    adopt_record(self._layout, self._store, key, value)

    def _apply_others(self, events: list[WatchEvent], revision: int, changed: set[IngressRef]) -> None:
        roots, records_dir = self._layout.roots_prefix, self._layout.records_dir
        for event in events:
            key = event.key
            if key.startswith(records_dir):
                value = None if event.deleted else event.value
                self._observed.set(key, value, revision)
                ref = adopt_record(self._layout, self._store, key, value)
                if ref is not None:
                    self._ledger.observed(ref, revision, record=True)
                    changed.add(ref)
            elif key.startswith(roots):
                self._observed.set(key, None if event.deleted else event.value, revision)
                self._changed_key(key, revision, changed)
            # Anything else in the watched range is not the mirror's: dropped by key, its value unread.

    def _changed_key(self, key: str, revision: int, changed: set[IngressRef]) -> None:
        # Peers (other sidecars) write these keys too: only a repair is worth an INFO line.
        logger.debug("key {} changed by another writer at revision {}", key, revision)
        ref = self._layout.owner_of_key(key)
        if ref is not None:
            self._ledger.observed(ref, revision, record=False)
            changed.add(ref)
        elif (obj := self._layout.object_of(key)) is not None and self._layout.is_shared(obj):
            self._on_stale(False)

def log_range(low: str, high: str, prefixes: tuple[str, str]) -> None:
    """Say what the one watch covers; a range between prefixes that share nothing spans every key between them."""
    shared = prefixes[0][:1] == prefixes[1][:1]
    # Keys in the range outside both prefixes cost etcd a message each, dropped here unread.
    logger.log(
        "INFO" if shared else "WARNING", "watching one key range, {!r} up to {!r}: the roots and the records prefix{}",
        low, high, "" if shared else " share no leading characters, so the range spans every key between them",
    )


def adopt_record(layout: KeyLayout, store: RecordStore, key: str, value: str | None) -> IngressRef | None:
    """Take a record read from etcd (None: deleted) into `store`; returns its ingress (None: not a record of one)."""
    ref = layout.record_ref(key)
    if ref is None:
        return None
    layout.object_label(ref.authority)  # its objects are now recognised by name
    if value is None:
        store.set(ref, None)
        return ref
    try:
        record = decode_record(value)
    except RecordDecodeError as exc:
        logger.error("ignoring record {}: {}", key, exc.title)
        return None
    if record.key != ref:
        logger.error("ignoring record {}: it holds ingress {}", key, record.key)
        return None
    store.set(ref, record)
    return ref
