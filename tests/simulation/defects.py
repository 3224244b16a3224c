"""Planted defects: each breaks one thing the mirror or the request path must get right; the simulation must catch it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any
from unittest import mock

import exporter.plan.planner
import exporter.reconcile.apply
import exporter.roles
import exporter.store.revisions
from exporter.etcd.types import WatchEvent
from exporter.ingress import Ingress
from exporter.keys import IngressRef
from exporter.plan.plan import Change, UnitPlan
from exporter.reconcile.apply import PlanWriter
from exporter.reconcile.mirror import Mirror
from exporter.roles import Ejections
from exporter.store.records import Record
from exporter.write.ledger import CommitLedger
from exporter.write.writer import ApplyResult

_committed = CommitLedger.committed
_unseen = CommitLedger.unseen
_apply = Mirror.apply
_apply_others = Mirror._apply_others
_relist = Mirror.relist
_tombstone_revision = exporter.store.revisions.tombstone_revision


@contextlib.contextmanager
def own_commit_applied_from_its_reply() -> Iterator[None]:
    """Our commit's keys go into the mirror from the reply, ahead of the watch."""

    def committed(self: CommitLedger, units: Sequence[UnitPlan], changes: Sequence[Change], revision: int) -> None:
        _committed(self, units, changes, revision)
        for change in changes:
            self._observed.set(change.key, change.new, revision)

    with mock.patch.object(CommitLedger, "committed", committed):
        yield


@contextlib.contextmanager
def revision_out_of_order() -> Iterator[None]:
    """The revisions of one watch message are applied newest first."""

    def apply(self: Mirror, events: Sequence[WatchEvent]) -> bool:
        groups = [list(g) for _r, g in itertools.groupby(events, key=lambda e: e.mod_revision)]
        newest = self.revision
        for group in reversed(groups):
            self._observed.revision = min(self.revision, group[0].mod_revision - 1)
            _apply(self, group)
            newest = max(newest, group[0].mod_revision)
        self._observed.revision = newest
        return True

    with mock.patch.object(Mirror, "apply", apply):
        yield


@contextlib.contextmanager
def plan_without_waiting() -> Iterator[None]:
    """An ingress is planned without waiting for the mirror to reach its last commit."""
    with mock.patch.object(CommitLedger, "unseen", lambda self, ref: 0):
        yield


@contextlib.contextmanager
def watch_restarted_at_the_wrong_revision() -> Iterator[None]:
    """After a listing the watch starts one revision late."""

    async def relist(self: Mirror, reason: str | None = None) -> None:
        await _relist(self, reason)
        self.feed._position = lambda: self.revision + 1

    with mock.patch.object(Mirror, "relist", relist):
        yield


@contextlib.contextmanager
def delete_event_dropped() -> Iterator[None]:
    """The mirror drops another writer's delete events."""

    def apply_others(self: Mirror, events: list[WatchEvent], revision: int, changed: set[object]) -> None:
        _apply_others(self, [e for e in events if not e.deleted], revision, changed)  # type: ignore[arg-type]

    with mock.patch.object(Mirror, "_apply_others", apply_others):
        yield


@contextlib.contextmanager
def remove_noop_over_tombstone() -> Iterator[None]:
    """A remove of an unknown or removed ingress is answered as a no-op, whatever its revision."""

    def noop(stored: Record | None, authority: str, ingress_id: str, revision: int | None) -> int | None:
        if stored is None or stored.removed:
            return None
        return _tombstone_revision(stored, authority, ingress_id, revision)

    with mock.patch.object(exporter.store.revisions, "tombstone_revision", noop):
        yield


@contextlib.contextmanager
def deposed_repair_unfenced() -> Iterator[None]:
    """The leader's own units (repair, reconcile, health) are written without the election fence."""

    async def write(self: PlanWriter, units: list[UnitPlan], groups: Mapping[IngressRef, int]) -> ApplyResult:
        pushed, own, shared = exporter.reconcile.apply.route(units, groups)
        result, *more = await asyncio.gather(self._writer.apply(pushed, shared=shared),
                                             *([self._writer.apply(own, (), shared=shared)] if own else []))
        for other in more:
            result.merge(other)
        return result

    with mock.patch.object(PlanWriter, "_write", write):
        yield


_plan = exporter.plan.planner.Planner.plan
_NONE_EJECTED = exporter.roles.NoEjections()


@contextlib.contextmanager
def ejection_sticky() -> Iterator[None]:
    """A server once ejected stays out of its ingress's load balancer after it returns."""
    ever: dict[IngressRef, frozenset[str]] = {}

    class Sticky:
        def __init__(self, ejections: Ejections) -> None:
            self._ejections = ejections

        def ejected(self, ref: IngressRef, ingress: Ingress) -> frozenset[str]:
            ever[ref] = ever.get(ref, frozenset()) | self._ejections.ejected(ref, ingress)
            return ever[ref]

    def plan(self: exporter.plan.planner.Planner, desired: Any, observed: Any, owners: Any = None,
             ejections: Ejections = _NONE_EJECTED, include_roots: bool = True) -> Any:
        return _plan(self, desired, observed, owners, Sticky(ejections), include_roots)

    with mock.patch.object(exporter.plan.planner.Planner, "plan", plan):
        yield


DEFECTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "own-commit-from-reply": own_commit_applied_from_its_reply,
    "revision-out-of-order": revision_out_of_order,
    "plan-without-waiting": plan_without_waiting,
    "watch-wrong-revision": watch_restarted_at_the_wrong_revision,
    "delete-dropped": delete_event_dropped,
    "remove-noop-over-tombstone": remove_noop_over_tombstone,
    "deposed-repair-unfenced": deposed_repair_unfenced,
    "ejection-sticky": ejection_sticky,
}
