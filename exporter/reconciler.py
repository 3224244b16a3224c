"""Keeps etcd equal to the desired state: the daemon's one writing loop.

Record changes (pushes, ingress files) arrive as intents and are gathered for a short
window so a burst shares few transactions (one Traefik reload). Watches on the managed
prefixes feed the observed mirror and flag owners someone else changed (drift repair); a
periodic full pass re-lists etcd and re-plans everything as a safety net. All planning and
writing happens in one task, so the mirror never races with itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loguru import logger

from .errors import EtcdUnavailable, ExporterError, StaleRevisionError
from .etcd.client import Compare, EtcdClient, EtcdError, WatchCanceled, WatchEvent
from .plan.format import format_plan
from .plan.observed import Observed
from .plan.plan import Plan, UnitPlan
from .plan.planner import NO_EJECTIONS, Ejections, Owner, Planner
from .store.records import (
    Record,
    RecordDecodeError,
    RecordStore,
    decode_record,
    owner_of_record_key,
    record_key,
)
from .store.revisions import classify_remove, classify_upsert
from .write import metrics
from .write.writer import Writer

_MAX_CONFLICT_RETRIES = 8
# Ingresses planned per step of a large batch; later steps are planned while earlier ones commit.
_PIPELINE_CHUNK = 256
_BACKOFF_MAX = 5.0


@dataclass(eq=False)
class Intent:
    """A requested record change (None removes); all intents of one request share `group`."""

    owner: Owner
    record: Record | None
    group: int
    future: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class Status:
    """What /readyz reports."""

    etcd_ok: bool = False
    synced: bool = False
    last_error: str | None = None
    foreign_keys: int = 0
    last_revision: int = 0
    full_passes: int = 0


class Reconciler:
    """Owns the desired records, the observed mirror, and every write to etcd."""

    def __init__(
        self,
        *,
        etcd: EtcdClient,
        planner: Planner,
        observed: Observed,
        records_prefix: str,
        coalesce_window: float = 0.02,
        reconcile_interval: float = 30.0,
        max_ops: int = 128,
        max_bytes: int = 1_000_000,
        max_in_flight: int = 8,
        dry_run: bool = False,
        tombstone_ttl: float = 86400.0,
    ) -> None:
        self.etcd = etcd
        self.planner = planner
        self.observed = observed
        self.store = RecordStore()
        self.status = Status()
        self.records_prefix = records_prefix
        self.ejected: Ejections = NO_EJECTIONS
        # Extra acceptance checks of a record (e.g. that a plugin provides its upstream kind).
        self.check_record: Callable[[Record], None] = lambda _record: None
        self.fence: Callable[[], Sequence[Compare]] = lambda: ()
        # Only the leader repairs drift, reconciles periodically and writes health changes.
        self.is_leader: Callable[[], bool] = lambda: True
        self._writer = Writer(etcd, observed, max_ops=max_ops, max_bytes=max_bytes, max_in_flight=max_in_flight)
        self._window = coalesce_window
        self._interval = reconcile_interval
        self._dry_run = dry_run
        self._tombstone_ttl = tombstone_ttl
        self._last_dry_run = ""
        self._queue: list[Intent] = []
        self._pending: dict[Owner, Record | None] = {}
        self._dirty: dict[Owner, str] = {}
        self._inflight: list[Intent] = []
        self._deferred: list[WatchEvent] = []
        self._draining: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._full_requested = True
        self._relist_requested = True
        self._stopping = False
        self._groups = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        self._synced = asyncio.Event()
        self._last_batch = 0.0
        self._queued_at = 0.0
        self._last_batch_groups = 0

    # ----- lifecycle

    async def start(self) -> None:
        """Start the write loop and the watches; returns at once (see `wait_synced`)."""
        self._tasks = [asyncio.create_task(self._loop(), name="reconcile-loop")]
        self._start_watches()

    def _start_watches(self) -> None:
        # After an etcd restart a long-poll watch can block forever without an error: on
        # recovery the watches are replaced rather than trusted.
        for task in self._tasks[1:]:
            task.cancel()
        self._tasks[1:] = [
            asyncio.create_task(self._watch(self.observed.roots_prefix), name="watch-roots"),
            asyncio.create_task(self._watch(self.records_prefix + "/"), name="watch-records"),
        ]

    async def wait_synced(self, timeout: float | None = None) -> None:
        """Wait until the first full sync with etcd is done."""
        await asyncio.wait_for(self._synced.wait(), timeout)

    async def stop(self) -> None:
        """Finish the batch in flight (a transaction is never left half-done), then stop."""
        self._stopping = True
        self._wake.set()
        loop_task, watches = (self._tasks[0], self._tasks[1:]) if self._tasks else (None, [])
        for task in watches:
            task.cancel()
        if loop_task is not None:
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(loop_task, timeout=10)
        for task in watches:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._draining is not None:
            self._draining.cancel()
        for intent in self._queue:
            if not intent.future.done():
                intent.future.set_exception(EtcdUnavailable("the exporter is shutting down; nothing was written"))
        self._queue.clear()

    # ----- inputs

    def desired(self, owner: Owner) -> Record | None:
        """The newest accepted record of an ingress (pending or committed; a tombstone if removed)."""
        if owner in self._pending:
            return self._pending[owner]
        return self.store.latest(owner)

    def stage(self, upserts: Sequence[Record], removes: Sequence[tuple[str, str, int]]) -> list[Intent]:
        """Validate revisions and queue the changes of one request; raises StaleRevisionError, writes nothing."""
        intents: list[Intent] = []
        group = next(self._groups)
        checked: list[tuple[Owner, Record | None]] = []
        for upsert in upserts:
            record: Record | None = upsert
            # Renders now (and warms the cache): a record Traefik would reject is refused before queueing.
            self.check_record(upsert)
            self.planner.renderer.render(upsert.ingress, self.ejected(upsert.key, upsert.ingress), upsert.content)
            if classify_upsert(self.desired(upsert.key), upsert) == "noop":
                record = self.desired(upsert.key)
            checked.append((upsert.key, record))
        for authority, ingress_id, revision in removes:
            stored = self.desired((authority, ingress_id))
            if stored is not None and classify_remove(stored, authority, ingress_id, revision) == "apply":
                checked.append(((authority, ingress_id), stored.removal(revision, time.time())))
        for owner, record in checked:
            self._pending[owner] = record
            intents.append(Intent(owner, record, group))
        if not self._queue:
            self._queued_at = time.monotonic()
        self._queue.extend(intents)
        self._wake.set()
        return intents

    async def submit(self, upserts: Sequence[Record], removes: Sequence[tuple[str, str, int]] = ()) -> None:
        """Stage one request and wait until all of it is committed (or raise)."""
        if not self.status.etcd_ok and self.status.synced:
            raise EtcdUnavailable("etcd is unreachable; nothing was written")
        intents = self.stage(upserts, removes)
        results = await asyncio.gather(*(i.future for i in intents), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def mark_dirty(self, owners: Sequence[Owner], reason: str) -> None:
        """Re-plan these ingresses soon; `reason` (health, drift, ...) is logged with each change."""
        for owner in owners:
            self._dirty.setdefault(owner, reason)
        self._wake.set()

    def request_full(self, relist: bool = False) -> None:
        """Ask for a full reconcile pass (and a re-list of etcd when `relist`)."""
        self._full_requested = True
        self._relist_requested = self._relist_requested or relist
        self._wake.set()

    async def load(self) -> None:
        """Read the records and managed keys from etcd (what `diff` compares against)."""
        await self._relist()

    def preview(self, upserts: Sequence[Record], removes: Sequence[Owner]) -> Plan:
        """The full plan after applying these changes to the loaded records, without writing."""
        view = {**self.store.tombstones, **self.store.records}
        view.update({r.key: r for r in upserts})
        for owner in removes:
            if owner in self.store.records:
                view[owner] = self.store.records[owner].removal(self.store.records[owner].revision, time.time())
        return self.planner.plan(view, self.observed, None, self.ejected)

    # ----- the loop

    async def _loop(self) -> None:
        backoff = 0.1
        next_full = time.monotonic()
        while True:
            timeout = max(0.0, next_full - time.monotonic())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            if self._stopping and not self._queue:
                return
            if self._window and self._in_burst():
                # Gather the rest of a burst so it shares transactions (and one Traefik reload),
                # for at most one window counted from the oldest queued request: under steady
                # load the queue fills while the previous batch commits, and nothing waits more.
                # A lone request is written at once: coalescing must not cost it latency.
                remaining = self._window - (time.monotonic() - self._queued_at)
                if remaining > 0:
                    await asyncio.sleep(remaining)
            self._wake.clear()
            if time.monotonic() >= next_full:
                self._full_requested = True
            try:
                if self._relist_requested:
                    recovering = self.status.synced and not self.status.etcd_ok
                    await self._relist()
                    if recovering:
                        logger.info("etcd reachable again: re-listed, restarting watches")
                        self._start_watches()
                if self._full_requested:
                    self._full_requested = False
                    next_full = time.monotonic() + self._interval
                    await self._full_pass()
                if self._queue or self._dirty:
                    self._last_batch_groups = len({i.group for i in self._queue})
                    await self._batch()
                    self._last_batch = time.monotonic()
                backoff = 0.1
                self.status.etcd_ok = True
            except EtcdError as exc:
                metrics.ETCD_ERRORS.inc()
                self.status.etcd_ok = False
                self.status.last_error = str(exc)
                logger.warning("etcd unavailable ({}); retrying in {:.1f}s", exc, backoff)
                self._fail_queue(EtcdUnavailable("etcd is unreachable; nothing was written"))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
                self._relist_requested = True
                next_full = time.monotonic()  # retry now: re-list and reconcile everything

    def _in_burst(self) -> bool:
        """Several requests queued, or the previous batch had several and ended within the window."""
        if len({i.group for i in self._queue}) > 1:
            return True
        recent = time.monotonic() - self._last_batch < self._window
        return bool(self._queue) and recent and self._last_batch_groups > 1

    def _fail_queue(self, error: ExporterError) -> None:
        for intent in self._queue:
            self._drop_pending(intent)
            if not intent.future.done():
                intent.future.set_exception(error)
        self._queue.clear()

    def _drop_pending(self, intent: Intent) -> None:
        if self._pending.get(intent.owner, False) is intent.record:
            del self._pending[intent.owner]

    async def _relist(self) -> None:
        """Rebuild the mirror and the committed records from a paged read of etcd."""
        roots = await self.etcd.range_prefix(self.observed.roots_prefix)
        records = await self.etcd.range_prefix(self.records_prefix + "/", revision=roots.revision)
        self.observed.load(
            ((kv.key, kv.value, kv.mod_revision) for kv in itertools.chain(roots.kvs, records.kvs)), roots.revision
        )
        listed = {self._adopt_record(kv.key, kv.value) for kv in records.kvs}
        for owner in [o for o in [*self.store.records, *self.store.tombstones] if o not in listed]:
            self.store.set(owner, None)
        self._relist_requested = False
        self.status.etcd_ok = True
        self.status.last_revision = roots.revision
        logger.info("listed etcd at revision {}: {} records, {} keys", roots.revision, len(records.kvs), len(roots.kvs))

    def _adopt_record(self, key: str, value: str | None) -> Owner | None:
        owner = owner_of_record_key(self.records_prefix, key)
        if owner is None:
            return None
        if value is None:
            self.store.set(owner, None)
            return owner
        try:
            record = decode_record(value)
        except RecordDecodeError as exc:
            logger.error("ignoring record {}: {}", key, exc)
            return None
        if record.key != owner:
            logger.error("ignoring record {}: it holds ingress {}/{}", key, *record.key)
            return None
        self.store.set(owner, record)
        return owner

    async def _full_pass(self) -> None:
        if not self.is_leader():
            self._mark_synced()
            return
        started = time.monotonic()
        expired = time.time() - self._tombstone_ttl
        view = dict(self.store.records)
        # Tombstones past their TTL are left out: the plan deletes their record key.
        view.update({o: r for o, r in self.store.tombstones.items() if r.removed_at > expired})
        view.update({o: r for o, r in self._pending.items() if r is not None})
        plan = self.planner.plan(view, self.observed, None, self.ejected)
        # Units of queued intents are written by the batch, with their requests.
        queued = {i.owner for i in self._queue}
        plan.units = [u for u in plan.units if u.owner not in queued]
        if plan.foreign and len(plan.foreign) != self.status.foreign_keys:
            logger.warning("{} foreign keys under managed roots (left alone), e.g. {}", len(plan.foreign), plan.foreign[0])
        self.status.foreign_keys = len(plan.foreign)
        if not plan.empty:
            await self._apply(plan, {}, {u.owner: "reconcile" for u in plan.units if u.owner})
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
        self._mark_synced()

    def _mark_synced(self) -> None:
        self.status.full_passes += 1
        if not self.status.synced:
            self.status.synced = True
            self._synced.set()

    async def _batch(self) -> None:
        intents, self._queue = self._queue, []
        dirty, self._dirty = self._dirty, {}
        if not intents and not dirty:
            return
        self._inflight = intents
        try:
            await self._write_batch(intents, dirty)
        except BaseException:
            for intent in intents:
                if not intent.future.done():
                    self._drop_pending(intent)
                    intent.future.set_exception(EtcdUnavailable("etcd is unreachable; nothing was written"))
            raise
        finally:
            self._inflight = []

    async def _write_batch(self, intents: list[Intent], dirty: dict[Owner, str]) -> None:
        by_owner: dict[Owner, list[Intent]] = {}
        for intent in intents:
            by_owner.setdefault(intent.owner, []).append(intent)
        # Owners in request order (a request's ingresses stay together), then the dirty ones
        # (only the leader writes those).
        leader = self.is_leader()
        owners = list(dict.fromkeys([i.owner for i in intents] + (list(dirty) if leader else [])))
        for attempt in range(_MAX_CONFLICT_RETRIES):
            conflicted = await self._plan_and_apply(owners, by_owner, dirty)
            if not conflicted:
                return
            await self._refresh(conflicted)
            owners = list(
                dict.fromkeys(
                    u.owner for u in conflicted if u.owner is not None and (u.owner in by_owner or self.is_leader())
                )
            )
            by_owner = {o: [i for i in by_owner.get(o, []) if not i.future.done()] for o in owners}
            logger.info("re-planning {} ingresses after a compare failed (attempt {})", len(owners), attempt + 1)
        for intent in intents:
            if not intent.future.done():
                self._drop_pending(intent)
                intent.future.set_exception(EtcdUnavailable("etcd kept changing under the exporter; retry"))
        self._dirty.update({o: "conflict" for o in owners})

    async def _plan_and_apply(
        self, owners: list[Owner], by_owner: dict[Owner, list[Intent]], dirty: dict[Owner, str]
    ) -> list[UnitPlan]:
        """Plan and write in chunks, so the next chunk is planned while earlier ones are in flight."""
        applying: list[asyncio.Task[list[UnitPlan]]] = []
        for start in range(0, len(owners), _PIPELINE_CHUNK):
            chunk = owners[start : start + _PIPELINE_CHUNK]
            view = {o: r for o in chunk if (r := self.desired(o)) is not None}
            plan = self.planner.plan(view, self.observed, chunk, self.ejected, include_roots=start == 0)
            chunk_intents = {o: by_owner[o] for o in chunk if o in by_owner}
            for owner in chunk:
                error = self.planner.errors.get(owner)
                for intent in chunk_intents.pop(owner, []) if error else []:
                    self._drop_pending(intent)
                    intent.future.set_exception(ExporterError(error or ""))
            applying.append(asyncio.create_task(self._apply(plan, chunk_intents, dirty)))
            await asyncio.sleep(0)  # let replies of transactions in flight be handled
        results = await asyncio.gather(*applying, return_exceptions=True)
        conflicted: list[UnitPlan] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            conflicted.extend(result)
        return conflicted

    async def _apply(
        self, plan: Plan, by_owner: dict[Owner, list[Intent]], reasons: dict[Owner, str]
    ) -> list[UnitPlan]:
        """Write `plan`; settle the intents of committed units; return conflicted units.

        Changes not asked for by an intent are logged with their key and reason (drift repair,
        health, reconcile).
        """
        first_group = min((i[0].group for i in by_owner.values() if i), default=-1)
        if not self.is_leader():
            # Followers, and a leader deposed between two conflict retries, write only what
            # requests ask for (never a leader-only change unfenced); the leader makes the rest.
            plan.units = [u for u in plan.units if u.owner in by_owner or (u.owner is None and first_group >= 0)]
        metrics.PLAN_CHANGES.observe(len(plan.changes()))
        groups: dict[int, list[UnitPlan]] = {}
        planned = set()
        for n, unit in enumerate(plan.units):
            intents = by_owner.get(unit.owner, []) if unit.owner else []
            # A root's own keys ride with the first request (create-only: no fence needed).
            group = intents[0].group if intents else (first_group if unit.owner is None and first_group >= 0 else -1 - n)
            groups.setdefault(group, []).append(unit)
            planned.add(unit.owner)
        # Intents whose ingress needs no change are committed already.
        for owner, intents in by_owner.items():
            if owner not in planned:
                self._settle(owner, intents)
        if plan.empty:
            return []
        for unit in plan.units:
            reason = reasons.get(unit.owner) if unit.owner else "reconcile"
            if unit.owner in by_owner or reason is None:
                continue
            if reason == "drift":
                metrics.REPAIRS.inc(len(unit.changes))
            for change in unit.changes[:20]:
                logger.info("{}: {} {}", reason, change.sign, change.key)
        if self._dry_run:
            text = format_plan(plan)
            if text != self._last_dry_run:
                logger.info("dry-run: would apply\n{}", text.rstrip())
                self._last_dry_run = text
            for owner, intents in by_owner.items():
                self._settle(owner, intents)
            return []
        # Requests are guarded by their record compares; everything else the leader writes on
        # its own (repair, reconcile, health) is fenced by the election key too.
        pushed = [g for key, g in groups.items() if key >= 0]
        own = [g for key, g in groups.items() if key < 0]
        applies = [self._writer.apply(pushed)]
        if own:
            applies.append(self._writer.apply(own, self.fence()))
        result, *more = await asyncio.gather(*applies)
        for other in more:
            result.committed += other.committed
            result.conflicted += other.conflicted
            result.failed += other.failed
            result.error = result.error or other.error
            result.revision = max(result.revision, other.revision)
        self.status.last_revision = max(self.status.last_revision, result.revision)
        for unit in result.committed:
            if unit.owner is None:
                continue
            if unit.owner in by_owner:
                self._settle(unit.owner, by_owner[unit.owner])
            else:
                self.store.set(unit.owner, unit.record)
        if result.error is not None:
            for owner in {u.owner for u in result.failed if u.owner is not None}:
                for intent in by_owner.get(owner, []):
                    self._drop_pending(intent)
                    if not intent.future.done():
                        intent.future.set_exception(EtcdUnavailable("etcd is unreachable; nothing was written"))
                if owner not in by_owner:
                    self._dirty[owner] = reasons.get(owner, "retry")
            raise result.error
        return result.conflicted

    def _settle(self, owner: Owner, intents: list[Intent]) -> None:
        for intent in intents:
            self.store.set(owner, intent.record)
            self._drop_pending(intent)
            if not intent.future.done():
                intent.future.set_result(None)

    async def _refresh(self, units: list[UnitPlan]) -> None:
        """Re-read what a conflicted unit guards, and adopt a record a peer wrote."""
        for unit in units:
            for compare in unit.compares:
                if compare.prefix:
                    page = await self.etcd.range_prefix(compare.key)
                    self.observed.replace_object(compare.key.rstrip("/"), page.kvs)
                else:
                    found = await self.etcd.get(compare.key)
                    value = found.value if found else None
                    self.observed.set(compare.key, value, found.mod_revision if found else 0)
                    if unit.owner is not None and compare.key.startswith(self.records_prefix + "/"):
                        self._reconcile_peer_record(unit.owner, value)

    def _reconcile_peer_record(self, owner: Owner, value: str | None) -> None:
        """A peer changed this record: adopt it; settle or fail the intents it answers."""
        self._adopt_record(record_key(self.records_prefix, *owner), value)
        stored = self.store.latest(owner)
        for intent in [i for i in self._inflight if i.owner == owner and not i.future.done()]:
            wanted = intent.record
            if (wanted is None and stored is None) or (
                wanted is not None and stored is not None and wanted.removed == stored.removed
                and (wanted.removed or wanted.content == stored.content)
            ):
                self._drop_pending(intent)
                intent.future.set_result(None)
            elif stored is not None and (wanted is None or stored.revision >= wanted.revision):
                self._drop_pending(intent)
                intent.future.set_exception(
                    StaleRevisionError(
                        f"ingress {owner[0]}/{owner[1]}: revision {stored.revision} was stored meanwhile",
                        {"authority": owner[0], "id": owner[1], "stored_revision": stored.revision},
                    )
                )

    # ----- watches

    async def _watch(self, prefix: str) -> None:
        backoff = 0.1
        last = 0
        while not self._stopping:
            await self._synced.wait()
            start = max(last, self.observed.revision) + 1
            try:
                async for events in self.etcd.watch_prefix(prefix, start, idle_timeout=max(60.0, self._interval * 2)):
                    self._on_events(events)
                    last = max(last, *(e.mod_revision for e in events))
                    if len(self._writer.own_revisions) > 100_000:
                        self._writer.own_revisions = {r for r in self._writer.own_revisions if r > last}
                    backoff = 0.1
            except WatchCanceled as exc:
                logger.warning("watch on {} canceled at compacted revision {}: re-listing", prefix, exc.compact_revision)
                self.request_full(relist=True)
            except EtcdError as exc:
                logger.debug("watch on {} ended ({}); resuming", prefix, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)

    def _on_events(self, events: list[WatchEvent]) -> None:
        if not self._writer.idle.is_set():
            # Our own transactions are in flight: their events are recognised by revision once
            # the replies are in, without decoding them.
            self._deferred.extend(events)
            if self._draining is None or self._draining.done():
                self._draining = asyncio.create_task(self._drain_deferred())
            return
        self._apply_events(events)

    async def _drain_deferred(self) -> None:
        while self._deferred:
            await self._writer.idle.wait()
            events, self._deferred = self._deferred, []
            self._apply_events(events)

    def _apply_events(self, events: list[WatchEvent]) -> None:
        changed: set[Owner] = set()
        own = self._writer.own_revisions
        for event in events:
            if event.mod_revision <= self.observed.revision or event.mod_revision in own:
                continue  # already known, or written by us (a txn is one revision)
            key = event.key
            seen = self.observed.keys.get(key)
            if seen is not None and seen[1] >= event.mod_revision:
                continue  # our own write, already applied
            if seen is None and event.deleted:
                continue
            value = event.value
            self.observed.set(key, value, event.mod_revision)
            if self._writer.inflight.get(key, "\x00") == value:
                continue  # our own transaction, seen before its reply
            if key.startswith(self.records_prefix + "/"):
                owner = self._adopt_record(key, value)
            else:
                # Peers (other sidecars) write these keys too: only a repair is worth an INFO line.
                logger.debug("key {} changed by another writer at revision {}", key, event.mod_revision)
                owner = self.observed.owner_of_key(key)
            if owner is not None:
                changed.add(owner)
        if changed:
            self.mark_dirty(sorted(changed), "drift")

