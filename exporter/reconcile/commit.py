"""Plan and write: turns desired records into guarded transactions, re-planning after conflicts.

Every plan is made against the mirror at its revision R (reconcile/mirror.py). An ingress
whose last commit w is newer than R is planned once R >= w, the others at once. A conflict
never reads etcd again: the mirror is waited for until it reaches the failed transaction's
header revision (or shows a compared key changed), and what conflicted is judged and
planned again against it.

A commit step returns an `Outcome` (which ingresses are done, which failed and why, what to
redo) and never answers a request itself. Requests are guarded by their record compares;
everything the leader writes on its own (repair, reconcile, health) is fenced by the
election key too, and a follower writes only what requests ask for.

What is written now is decided by the write policies (write/policies.py), applied to every
plan at one seam (reconcile/apply.py, which writes each plan): a follower writes only what requests ask for; while a root's Traefik is
behind (write/pacer.py) a request commits its records alone and the keys of every ingress on
that root are held, and the leader writes what is held once the root is due, all of it together.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from loguru import logger

from ..errors import EtcdError, EtcdUnavailable
from ..keys import IngressRef
from ..metrics import Metrics
from ..plan.plan import Plan, UnitPlan
from ..plan.planner import Planner
from ..roles import Ejections, LeaderPolicy
from ..store.observed import Observed
from ..store.records import Record, RecordStore
from ..write.policies import WritePolicy
from ..write.writer import Writer
from .apply import PlanWriter
from .intents import Outcome
from .judge import Calls, Judge
from .mirror import Mirror

_MAX_CONFLICT_RETRIES = 8
# Ingresses planned per step of a large batch; later steps are planned while earlier ones commit.
_PIPELINE_CHUNK = 256


@dataclass
class Batch:
    """Ingresses to write now: every request of the batch that changes each ingress, in order
    (request, record), and the dirty ones."""

    calls: Calls
    dirty: dict[IngressRef, str] = field(default_factory=dict)

    @property
    def requested(self) -> dict[IngressRef, int]:
        """Each requested ingress with the first request that changes it (requests share transactions)."""
        return {ref: calls[0][0] for ref, calls in self.calls.items()}


class Committer:
    """Plans the given ingresses against the mirror and writes the plan."""

    def __init__(
        self,
        *,
        planner: Planner,
        observed: Observed,
        store: RecordStore,
        writer: Writer,
        mirror: Mirror,
        leader: LeaderPolicy,
        ejections: Ejections,
        policies: Sequence[WritePolicy],
        metrics: Metrics,
        dry_run: bool = False,
    ) -> None:
        self._planner = planner
        self._policies = policies
        self._plans = PlanWriter(writer=writer, leader=leader, policies=policies, metrics=metrics, dry_run=dry_run)
        self._observed = observed
        self._store = store
        self._writer = writer
        self._ledger = writer.ledger
        self._mirror = mirror
        self._leader = leader
        self._ejections = ejections
        self._judge = Judge(store)

    async def commit(self, batch: Batch) -> Outcome:
        """Write `batch`, re-planning what lost a compare; requests come first, then (leader only) the dirty."""
        outcome = Outcome()
        requested = dict(batch.requested)
        refs = list(dict.fromkeys([*requested, *(batch.dirty if self._leader.is_leader() else ())]))
        await self._commit_refs(refs, requested, batch, outcome)
        if outcome.error is None and self._leader.is_leader() and self._observed.sharing.orphans():
            await self._delete_orphans(outcome)
        return outcome

    async def _delete_orphans(self, outcome: Outcome) -> None:
        """Delete the shared objects nothing references now, once: a writer naming one meanwhile fails it (planned again with its root)."""
        # Our own commits name what they reference: an object is an orphan only in a mirror that holds them.
        await self._mirror.reached(self._ledger.own.newest)
        roots = orphaned_roots(self._observed, self._store)
        if not roots:
            return
        plan = self._planner.plan_orphans(roots, self._observed)
        try:
            await self._plans.apply(plan, {}, {}, outcome)
        except EtcdError as exc:
            outcome.error = exc

    async def _commit_refs(self, refs: list[IngressRef], requested: dict[IngressRef, int], batch: Batch, outcome: Outcome) -> Outcome:
        """Plan and write `refs`; what lost a compare is planned again once the mirror shows why (up to 8 times)."""
        try:
            for attempt in range(_MAX_CONFLICT_RETRIES):
                leading = self._leader.is_leader()
                # An orphan's deletion or a root's key that lost a compare is planned again with its root.
                units, at = await self._plan_and_apply(refs, requested, batch, outcome)
                conflicted = [u for u in units if u.owner is not None]
                if not conflicted or outcome.error is not None:
                    return outcome
                await self._mirror.settled(conflicted, at, functools.partial(deposed, self._leader, leading))
                requested = {r: requested[r] for r in outcome.open(requested)}
                refs = retried(conflicted, requested, batch.calls, leading=self._leader.is_leader())
                logger.info("re-planning {} ingresses after a compare failed (attempt {})", len(refs), attempt + 1)
        except EtcdError as exc:
            outcome.error = exc
            return outcome
        for ref in outcome.open(requested):
            outcome.failed[ref] = EtcdUnavailable("etcd kept changing under the exporter; retry")
        outcome.redo.update(dict.fromkeys(refs, "conflict"))
        return outcome

    async def reconcile_all(
        self, view: Callable[[], Mapping[IngressRef, Record]], skip: Callable[[], set[IngressRef]]
    ) -> tuple[Plan, Outcome]:
        """Plan every known ingress against the mirror and write what differs (except what `skip` gives).

        The desired records (`view`) are taken in the same step as the plan, once the mirror
        (which the committed records derive from) holds every commit of ours.
        """
        outcome = Outcome()
        await self._mirror.reached(self._ledger.own.newest)
        plan = self._planner.plan(view(), self._observed, None, self._ejections)
        skipped = skip()
        plan.units = [u for u in plan.units if u.owner not in skipped]
        if not plan.empty:
            await self._plans.apply(plan, {}, {u.owner: "reconcile" for u in plan.units if u.owner}, outcome)
        return plan, outcome

    async def _plan_and_apply(
        self, refs: list[IngressRef], requested: dict[IngressRef, int], batch: Batch, outcome: Outcome
    ) -> tuple[list[UnitPlan], int]:
        """Plan and write in chunks, so the next chunk is planned while earlier ones are in flight.

        Returns the units that lost a compare and the revision etcd evaluated the compares at.
        """
        applying: list[asyncio.Task[tuple[list[UnitPlan], int]]] = []
        # Ingresses whose last commit the mirror has not reached yet are planned once it has.
        unseen = {ref: w for ref in refs if (w := self._ledger.unseen(ref))}
        waves = [[r for r in refs if r not in unseen], [r for r in refs if r in unseen]] if unseen else [refs]
        first = True
        for wave in waves:
            if wave is not waves[0]:
                await self._mirror.reached(max(unseen.values()))
            # A policy may ask for one plan, packed into the fewest transactions (pacing: revisions
            # under a root cost more than the latency steps save).
            step = max(1, len(wave)) if any(p.whole_batches for p in self._policies) else _PIPELINE_CHUNK
            if len(wave) > step:  # a request may span chunks: the whole wave is judged first, each chunk again at its plan
                wave, _ = self._judge.judge(wave, requested, batch.calls, outcome)
            for start in range(0, len(wave), step):
                plan, groups = self._plan_step(wave[start : start + step], requested, batch.calls, outcome, include_roots=first)
                first = False
                applying.append(asyncio.create_task(self._plans.apply(plan, groups, batch.dirty, outcome)))
                await asyncio.sleep(0)  # let replies of transactions in flight be handled
        results = await asyncio.gather(*applying, return_exceptions=True)
        conflicted: list[UnitPlan] = []
        at = 0
        for result in results:
            if isinstance(result, BaseException):
                raise result
            conflicted.extend(result[0])
            at = max(at, result[1])
        return conflicted, at

    def _plan_step(
        self, chunk: list[IngressRef], requested: Mapping[IngressRef, int], calls: Calls, outcome: Outcome, *, include_roots: bool
    ) -> tuple[Plan, dict[IngressRef, int]]:
        """The plan of `chunk`, and the request group of each requested ingress in it (render errors fail theirs)."""
        started = time.time_ns()
        # Judged in the same step as the plan: nothing the watch brings can come in between.
        chunk, records = self._judge.judge(chunk, requested, calls, outcome)
        view = {r: record for r in chunk if (record := records.get(r) or self._store.latest(r)) is not None}
        plan = self._planner.plan(view, self._observed, chunk, self._ejections, include_roots=include_roots)
        self._writer.tracing.planned(started, plan.revision, chunk)
        groups = {}
        for ref in chunk:
            error = self._planner.errors.get(ref)
            if ref in requested and error is not None:
                outcome.failed[ref] = error
            elif ref in requested and ref not in outcome.done:
                groups[ref] = requested[ref]
        return plan, groups


def retried(conflicted: Sequence[UnitPlan], requested: Mapping[IngressRef, int], calls: Calls, *, leading: bool) -> list[IngressRef]:
    """What to plan again: open requests; and, for the leader, other ingresses (not requests a peer answered)."""
    refs = (u.owner for u in conflicted if u.owner is not None)
    return list(dict.fromkeys(r for r in refs if r in requested or (leading and r not in calls)))


def deposed(leader: LeaderPolicy, leading: bool) -> bool:
    """True when this exporter led when it wrote (`leading`) and leads no more (its fence failed)."""
    return leading and not leader.is_leader()


def orphaned_roots(observed: Observed, store: RecordStore) -> list[str]:
    """The roots of this exporter's ingresses that hold orphans (other roots under the same prefix are someone else's)."""
    orphaned = {path.rsplit("/", 3)[0] for path in observed.sharing.orphans()}
    authorities = {ref.authority for ref in (*store.records, *store.tombstones)}
    return sorted(orphaned & {observed.layout.root(authority) for authority in authorities})
