"""The write loop: when to re-list, reconcile everything, or write a batch; and backing off when etcd fails.

Scheduling only: what to write is the committer's job, answering requests the intents'.
Requests arriving in a burst are gathered for a short window so they share transactions
(one Traefik reload); a lone request is written at once. A periodic full pass re-plans
everything as a safety net. All planning and writing happens in this one task, so the
mirror never races with itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from loguru import logger

from ..errors import EtcdError, EtcdUnavailable, ExporterError
from ..metrics import Metrics
from ..roles import LeaderPolicy
from ..tracing.hooks import NO_TRACING, Tracing
from ..write.pacer import Pacer
from .commit import Batch, Committer
from .inbox import Inbox
from .intents import NOT_WRITTEN, Intents
from .mirror import Mirror

INTERNAL_ERROR = "internal error; see the exporter log"
SHUTTING_DOWN = "the exporter is shutting down; nothing was written"
_BACKOFF_MIN = 0.1
_BACKOFF_MAX = 5.0


@dataclass
class Status:
    """What /readyz reports."""

    etcd_ok: bool = False
    synced: bool = False
    last_error: str | None = None
    foreign_keys: int = 0
    full_passes: int = 0


@dataclass(frozen=True)
class Cadence:
    """How often the loop acts: the burst window, the full-pass interval, the tombstone lifetime."""

    coalesce_window: float = 0.02
    reconcile_interval: float = 30.0
    tombstone_ttl: float = 86400.0
    pace_hold_max: float = 30.0


def now() -> float:
    """The event loop's clock (time.monotonic's in production; the simulation's virtual one)."""
    return asyncio.get_running_loop().time()


class Loop:
    """Runs until stopped: re-list, full pass, batch, in that order, whenever there is work."""

    def __init__(
        self, *, inbox: Inbox, intents: Intents, mirror: Mirror, committer: Committer, leader: LeaderPolicy,
        status: Status, cadence: Cadence, pacer: Pacer, metrics: Metrics, prepare: Callable[[], Awaitable[None]] | None = None,
        after_full_pass: Callable[[], None] | None = None, tracing: Tracing = NO_TRACING,
    ) -> None:
        self._pacer = pacer
        self._tracing = tracing
        self._metrics = metrics
        self._prepare = prepare
        self._after_full_pass = after_full_pass
        self._inbox = inbox
        self._intents = intents
        self._mirror = mirror
        self._committer = committer
        self._leader = leader
        self._status = status
        self._cadence = cadence
        self._synced = asyncio.Event()
        self._stopping = False
        self._last_batch = 0.0
        self._last_batch_requests = 0

    async def wait_synced(self, timeout: float | None = None) -> None:
        """Wait until the first full sync with etcd is done."""
        await asyncio.wait_for(self._synced.wait(), timeout)

    def stop(self) -> None:
        """Finish what is queued, then return from `run`."""
        self._stopping = True
        self._inbox.poke()

    async def run(self) -> None:
        """The loop itself."""
        backoff = _BACKOFF_MIN
        next_full = now()
        while True:
            # Timed out: the full pass is due (whatever a clock that moves in ticks reads then).
            due = not await self._inbox.wait(max(0.0, next_full - now()))
            if self._stopping and not self._intents.queued_requests:
                return
            await self._gather_burst()
            self._inbox.clear()
            if due or now() >= next_full:
                self._inbox.full_requested = True
            try:
                next_full = await self._turn(next_full)
                backoff = _BACKOFF_MIN
                self._status.etcd_ok = True
            except EtcdError as exc:
                self._etcd_down(exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
                next_full = now()  # retry now: re-list and reconcile everything
            except Exception:  # noqa: BLE001 - a bug must not silently stop every write
                logger.exception("reconcile loop failed; re-listing and retrying in {:.1f}s", backoff)
                self._intents.fail_queue(ExporterError(INTERNAL_ERROR))
                self._inbox.relist_requested = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
                next_full = now()

    async def _gather_burst(self) -> None:
        # Gather the rest of a burst so it shares transactions (and one Traefik reload), for at
        # most one window counted from the oldest queued request. A lone request is written at
        # once: coalescing must not cost it latency. The window ends early once as many
        # requests are queued as the previous batch answered: clients that wait for their
        # answer before pushing again (the usual coordinator) have all come back, and waiting
        # longer would only slow them down while adding nothing to the batch.
        window = self._cadence.coalesce_window
        if not window or not self._in_burst():
            return
        deadline = self._intents.queued_at + window
        expected = self._last_batch_requests if self._steady() else None
        while expected is None or self._intents.queued_requests < expected:
            remaining = deadline - now()
            if remaining <= 0:
                return
            self._inbox.clear()
            if not await self._inbox.wait(remaining):
                return

    def _in_burst(self) -> bool:
        """Several requests queued, or one while a burst lasts."""
        queued = self._intents.queued_requests
        return queued > 1 or (bool(queued) and self._steady())

    def _steady(self) -> bool:
        """A burst lasts: the previous batch answered several requests and ended within the window."""
        return now() - self._last_batch < self._cadence.coalesce_window and self._last_batch_requests > 1

    async def _turn(self, next_full: float) -> float:
        if self._inbox.relist_requested:
            await self._relist()
        if self._inbox.full_requested:
            self._inbox.full_requested = False
            next_full = now() + self._cadence.reconcile_interval
            await self._full_pass()
        if due := self._pacer.due():
            self._inbox.redo(due)
        try:
            if self._intents.queued_requests or self._inbox.dirty:
                await self._batch()
        finally:
            self._pacer.flushed()
        return next_full

    def _etcd_down(self, exc: EtcdError, backoff: float) -> None:
        self._metrics.etcd_errors.inc()
        self._status.etcd_ok = False
        self._status.last_error = exc.title
        logger.warning("etcd unavailable ({}); retrying in {:.1f}s", exc.title, backoff)
        self._intents.fail_queue(EtcdUnavailable(NOT_WRITTEN))
        self._inbox.relist_requested = True

    async def _relist(self) -> None:
        if self._prepare is not None:
            await self._prepare()  # what must be known of etcd before anything is written
        recovering = self._status.synced and not self._status.etcd_ok
        await self._mirror.relist("start" if not self._status.synced else "recovered" if recovering else None)
        self._inbox.relist_requested = False
        self._status.etcd_ok = True
        if recovering:
            logger.info("etcd reachable again: listed, watching from there")

    async def _full_pass(self) -> None:
        if self._leader.is_leader():
            started = time.perf_counter()
            # Ingresses of queued requests are written by the batch, with their requests.
            plan, outcome = await self._committer.reconcile_all(
                lambda: self._intents.desired_view(time.time() - self._cadence.tombstone_ttl), self._intents.queued_refs
            )
            self._inbox.redo(outcome.redo)
            if outcome.error is not None:
                raise outcome.error
            if plan.foreign and len(plan.foreign) != self._status.foreign_keys:
                logger.warning("{} foreign keys under managed roots (left alone), e.g. {}", len(plan.foreign), plan.foreign[0])
            self._status.foreign_keys = len(plan.foreign)
            self._metrics.reconcile_seconds.observe(time.perf_counter() - started)
        self._status.full_passes += 1
        if self._after_full_pass is not None:
            self._after_full_pass()
        if not self._status.synced:
            self._status.synced = True
            self._synced.set()

    async def _batch(self) -> None:
        intents = self._intents.take()
        dirty = self._inbox.take_dirty()
        self._last_batch_requests = len({i.group for i in intents})
        batch = Batch(calls=Intents.calls(intents), dirty=dirty)
        traced = [(i.trace, i.ref) for i in intents] if self._tracing.enabled else []
        with self._tracing.batch(traced, self._pacer.flushing_roots()):
            try:
                outcome = await self._committer.commit(batch)
            except Exception:
                # commit() turns etcd failures into its outcome: anything else is a bug.
                self._intents.fail_all(intents, ExporterError(INTERNAL_ERROR))
                raise
            except BaseException:
                self._intents.fail_all(intents, EtcdUnavailable(SHUTTING_DOWN))
                raise
            try:
                # Answered once the mirror holds what committed: the records an answer promises are then the store's.
                await self._mirror.reached(outcome.revision)
            finally:
                self._intents.resolve(intents, outcome)
        self._inbox.redo(outcome.redo)
        self._last_batch = now()
        if outcome.error is not None:
            raise outcome.error
