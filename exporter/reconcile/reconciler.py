"""The reconciler: keeps etcd equal to the desired state, built from its parts.

`Intents` (requests and their answers), `Mirror` (etcd as last seen), `Committer` (plan and
guarded writes) and `Loop` (when to do what) share one `Inbox`; this class wires them and is
what the sources, the CLI and the daemon talk to.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from loguru import logger

from ..errors import EtcdUnavailable, TemplateError
from ..etcd.limits import EtcdLimits, detect_limits
from ..etcd.store import EtcdStore
from ..keys import IngressRef, KeyLayout
from ..metrics import Metrics
from ..plan.format import format_plan
from ..plan.plan import Plan
from ..plan.planner import Planner
from ..roles import Admission, AdmitAll, AlwaysLeader, Ejections, LeaderPolicy, NoEjections
from ..store.observed import Observed
from ..store.records import Record, RecordStore, Removal
from ..store.revisions import classify_upsert, removal_record
from ..supervisor import Supervisor
from ..tracing.hooks import NO_TRACING, Tracing
from ..write.ledger import CommitLedger
from ..write.pacer import Pacer
from ..write.policies import FollowerRule, PacingRule
from ..write.writer import Writer
from .advice import Advice
from .commit import Committer
from .inbox import Inbox
from .intents import Intents, answered
from .loop import SHUTTING_DOWN, Cadence, Loop, Status
from .mirror import Mirror, MirrorSummary


@dataclass(frozen=True)
class TxnLimits:
    """etcd's limits per transaction (None: detected from etcd before the first write), and how many may be in flight."""

    max_ops: int | None = None
    max_bytes: int | None = None
    max_in_flight: int = 8


@dataclass(frozen=True)
class Collaborators:
    """What a reconciler shares with the rest of a daemon; each one left unset is a lone reconciler's own.

    The daemon passes the record store the health engine listens to, the observed mirror the
    health engine reads, the inbox it marks dirty, its leadership, the health engine as
    ejections, the admission checks, and the supervisor of its tasks.
    """

    store: RecordStore | None = None
    observed: Observed | None = None
    inbox: Inbox | None = None
    leader: LeaderPolicy | None = None
    ejections: Ejections | None = None
    admission: Admission | None = None
    supervisor: Supervisor | None = None
    metrics: Metrics | None = None
    # Whether a root's Traefik has not applied the newest commit on it (write/pacer.py); None: never paced.
    behind: Callable[[str], bool] | None = None
    tracing: Tracing = NO_TRACING


class Reconciler:
    """Owns the desired records, the observed mirror, and every write to etcd."""

    def __init__(
        self,
        *,
        etcd: EtcdStore,
        layout: KeyLayout,
        planner: Planner,
        shared: Collaborators = Collaborators(),
        cadence: Cadence = Cadence(),
        limits: TxnLimits = TxnLimits(),
        dry_run: bool = False,
    ) -> None:
        self.store = shared.store if shared.store is not None else RecordStore()
        self.status = Status()
        self.observed = shared.observed if shared.observed is not None else Observed(layout)
        self._planner = planner
        self._inbox = shared.inbox if shared.inbox is not None else Inbox()
        self._ejections = shared.ejections if shared.ejections is not None else NoEjections()
        self._admission = shared.admission if shared.admission is not None else AdmitAll()
        self._intents = Intents(self.store)
        self._supervisor = shared.supervisor if shared.supervisor is not None else Supervisor()
        leader = shared.leader if shared.leader is not None else AlwaysLeader()
        self.ledger = CommitLedger(self.observed)
        self.pacer = Pacer(shared.behind, cadence.pace_hold_max)
        metrics = self.metrics = shared.metrics if shared.metrics is not None else Metrics()
        metrics.paced_ingresses.read_from(lambda: self.pacer.counts({layout.root(ref.authority) for ref in self.store.records}))
        writer = Writer(etcd, self.ledger, max_ops=limits.max_ops, max_bytes=limits.max_bytes, max_in_flight=limits.max_in_flight,
                        metrics=metrics, tracing=shared.tracing)
        self._etcd, self._writer, self._limits = etcd, writer, limits
        self.detected: EtcdLimits | None = None
        self.advice = Advice(layout, self.store, self.observed, lambda: self.detected)
        self._mirror = Mirror(
            etcd, layout, self.observed, self.store, writer, self.ledger,
            on_drift=self._drifted, on_stale=self._stale, idle_timeout=max(60.0, cadence.reconcile_interval * 2),
            supervisor=self._supervisor, metrics=metrics,
        )
        # What `GET /v1/mirror` answers: the mirror's revision, prefixes, key count and digest.
        self.mirror_summary: Callable[[], MirrorSummary] = self._mirror.summary
        committer = Committer(
            planner=planner, observed=self.observed, store=self.store, writer=writer, mirror=self._mirror,
            leader=leader, ejections=self._ejections,
            policies=[FollowerRule(leader), PacingRule(self.pacer)], metrics=metrics, dry_run=dry_run,
        )
        self._loop = Loop(
            inbox=self._inbox, intents=self._intents, mirror=self._mirror, committer=committer, leader=leader,
            status=self.status, cadence=cadence, pacer=self.pacer, metrics=metrics, prepare=self._detect_limits,
            after_full_pass=self.advice.after_full_pass, tracing=shared.tracing,
        )
        self._layout = layout
        self._task: asyncio.Task[None] | None = None

    # ----- lifecycle

    async def start(self) -> None:
        """Start the write loop and the watches; returns at once (see `wait_synced`)."""
        self._task = self._supervisor.spawn("reconcile-loop", self._loop.run)
        self._mirror.start()

    async def wait_synced(self, timeout: float | None = None) -> None:
        """Wait until the first full sync with etcd is done."""
        await self._loop.wait_synced(timeout)

    async def stop(self) -> None:
        """Finish the batch in flight (a transaction is never left half-done), then stop."""
        self._loop.stop()
        await self._mirror.stop()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(self._task, timeout=10)
        self._intents.fail_queue(EtcdUnavailable(SHUTTING_DOWN))

    async def _detect_limits(self) -> None:
        """Once, before the first write: the limits the settings leave unset, from etcd itself."""
        if self.detected is not None or (self._limits.max_ops is not None and self._limits.max_bytes is not None):
            return
        self.detected = await detect_limits(self._etcd, self._layout.records_prefix + ".limits-probe")
        ops = self._limits.max_ops or self.detected.max_txn_ops
        # The writer's size of a transaction is an estimate: stay a tenth below etcd's bound.
        size = self._limits.max_bytes or self.detected.max_request_bytes * 9 // 10
        self._writer.set_limits(ops, size)
        logger.info(
            "etcd accepts {} operations and {} bytes per transaction (detected); writing up to {} operations, {} bytes",
            self.detected.max_txn_ops, self.detected.max_request_bytes, ops, size,
        )

    # ----- requests

    async def submit(self, upserts: Sequence[Record], removes: Sequence[Removal] = ()) -> None:
        """Check one request, queue it, and wait until all of it is committed (or raise; then nothing was written)."""
        if not self.status.etcd_ok and self.status.synced:
            raise EtcdUnavailable("etcd is unreachable; nothing was written")
        intents = self._intents.stage(self._checked(upserts, removes), self._writer.tracing.staged())
        self._inbox.poke()
        await answered(intents)

    def _checked(self, upserts: Sequence[Record], removes: Sequence[Removal]) -> list[tuple[IngressRef, Record]]:
        """The record each ingress of a request must become; raises (writing nothing) when any is refused."""
        changes: list[tuple[IngressRef, Record]] = []
        for upsert in upserts:
            self._admission.admit(upsert.ingress)
            # A record Traefik would reject is refused before queueing.
            self._planner.admit(upsert, self._ejections)
            stored = self._intents.desired(upsert.key)
            noop = classify_upsert(stored, upsert) == "noop"
            changes.append((upsert.key, stored if noop and stored is not None else upsert))
        for removal in removes:
            record = removal_record(self._intents.desired(removal.ref), removal, time.time())
            if record is not None:
                changes.append((removal.ref, record))
        return changes

    @property
    def queued_requests(self) -> int:
        """Requests staged and not yet planned (waiting in a burst, or behind the batch being written)."""
        return self._intents.queued_requests

    def traefik_checked(self) -> None:
        """Traefik was just checked: wake the loop when keys held for it may be written now."""
        if self.pacer.ready():
            self._inbox.poke()

    def keys_pending(self, ref: IngressRef) -> bool:
        """True when the ingress's record is committed and its keys are not written yet (held for Traefik's pace)."""
        if self.pacer.holds(ref):
            return True
        if not self.ledger.awaits_keys(ref):
            return False
        # Held by this sidecar once, due since: written by whoever leads, or found already right.
        record = self.store.latest(ref)
        if record is not None:
            plan = self._planner.plan({ref: record}, self.observed, [ref], self._ejections, include_roots=False)
            record_key = self._layout.record_key(ref)
            if any(c.key != record_key for u in plan.units for c in u.changes):
                return True
        self.ledger.keys_written(ref)
        return False

    @property
    def records(self) -> dict[IngressRef, Record]:
        """The stored records (tombstones left out)."""
        return self.store.records

    def rendered_keys(self, ref: IngressRef) -> dict[str, str]:
        """The keys the ingress renders to now (its health ejections applied); raises TemplateError."""
        record = self.store.latest(ref)
        return self._planner.rendered(record, self._ejections) if record is not None else {}

    def preview_one(self, ref: IngressRef) -> str:
        """What `diff` would print for this ingress alone (empty: etcd holds what it renders to)."""
        record = self.store.latest(ref)
        view = {ref: record} if record is not None else {}
        return format_plan(self._planner.plan(view, self.observed, [ref], self._ejections, include_roots=False))

    def mark_dirty(self, refs: Sequence[IngressRef], reason: str) -> None:
        """Re-plan these ingresses soon; `reason` (health, drift, ...) is logged with each change."""
        self._inbox.mark_dirty(refs, reason)

    def ca_files_in_use(self) -> set[str]:
        """The upstream CA files the stored ingresses name."""
        return {path for record in self.store.records.values() if (path := record.ingress.ca_file)}

    def ca_file_changed(self, path: str) -> None:
        """A CA file was rotated: rewrite every transport that names it (through the guarded write path)."""
        refs = [ref for ref, record in self.store.records.items() if record.ingress.ca_file == path]
        logger.info("upstream CA file {} changed: rewriting the transports of {} ingresses", path, len(refs))
        self.mark_dirty(refs, "ca-file")

    def request_full(self, relist: bool = False) -> None:
        """Ask for a full reconcile pass (and a re-list of etcd when `relist`)."""
        self._inbox.request_full(relist)

    def _drifted(self, refs: Sequence[IngressRef]) -> None:
        self._inbox.mark_dirty(refs, "drift")

    def _stale(self, relist: bool) -> None:
        self._inbox.request_full(relist=relist)

    # ----- views

    @property
    def render_errors(self) -> Mapping[IngressRef, TemplateError]:
        """Ingresses whose keys are left as they are because their render failed."""
        return self._planner.errors

    async def load(self) -> None:
        """Read the records and managed keys from etcd (what `diff` compares against)."""
        await self._mirror.relist()

    def preview(self, upserts: Sequence[Record], removes: Sequence[IngressRef]) -> Plan:
        """The full plan after applying these changes to the loaded records, without writing."""
        view = {**self.store.tombstones, **self.store.records}
        view.update({r.key: r for r in upserts})
        for ref in removes:
            if ref in self.store.records:
                view[ref] = self.store.records[ref].removal(self.store.records[ref].revision, time.time())
        return self._planner.plan(view, self.observed, None, self._ejections)
