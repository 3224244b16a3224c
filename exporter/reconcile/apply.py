"""Write a plan and record what it achieved: the write policies' split, the dry run, the guarded
transactions (requests' units with their requests, the leader's own fenced), and the outcome.

The committer (reconcile/commit.py) decides what to plan and when; this writes each plan it makes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from loguru import logger

from ..errors import EtcdUnavailable
from ..keys import IngressRef
from ..metrics import Metrics
from ..plan.format import format_plan
from ..plan.plan import Plan, UnitPlan
from ..roles import LeaderPolicy
from ..write.policies import WritePolicy
from ..write.writer import ApplyResult, Writer
from .intents import NOT_WRITTEN, Outcome

# Changes logged per unit that no request asked for (repair, health, reconcile).
_LOGGED_CHANGES = 20


class PlanWriter:
    """Writes plans through the write policies; with `dry_run`, logs each new plan instead."""

    def __init__(
        self, *, writer: Writer, leader: LeaderPolicy, policies: Sequence[WritePolicy], metrics: Metrics, dry_run: bool = False
    ) -> None:
        self._writer = writer
        self._leader = leader
        self._policies = policies
        self._metrics = metrics
        self._dry_run = dry_run
        self._last_dry_run = ""

    async def apply(
        self, plan: Plan, groups: Mapping[IngressRef, int], reasons: Mapping[IngressRef, str], outcome: Outcome
    ) -> tuple[list[UnitPlan], int]:
        """Write `plan`, recording what committed in `outcome`; returns the units that lost a compare and
        the revision etcd evaluated those compares at."""
        for policy in self._policies:
            plan.units = policy.split(plan.units, groups, reasons).now
        self._metrics.plan_changes.observe(len(plan.changes()))
        planned = {u.owner for u in plan.units}
        # Requested ingresses that need no change are as desired already.
        outcome.done.update(ref for ref in groups if ref not in planned)
        if plan.empty:
            return [], 0
        log_unrequested(self._metrics, plan.units, groups, reasons)
        if self._dry_run:
            self._log_dry_run(plan)
            outcome.done.update(groups)
            return [], 0
        result = await self._write(plan.units, groups)
        self._record(result, groups, reasons, outcome)
        return result.conflicted, result.conflict_revision

    async def _write(self, units: list[UnitPlan], groups: Mapping[IngressRef, int]) -> ApplyResult:
        pushed, own, shared = route(units, groups)
        applies = [self._writer.apply(pushed, shared=shared)]
        if own:
            applies.append(self._writer.apply(own, self._leader.fence(), shared=shared))
        result, *more = await asyncio.gather(*applies)
        for other in more:
            result.merge(other)
        return result

    def _record(
        self, result: ApplyResult, groups: Mapping[IngressRef, int], reasons: Mapping[IngressRef, str], outcome: Outcome
    ) -> None:
        for policy in self._policies:
            policy.committed(result.committed)
        outcome.revision = max(outcome.revision, result.revision)
        outcome.done.update(unit.owner for unit in result.committed if unit.owner is not None and unit.owner in groups)
        if result.error is None:
            return
        for ref in {u.owner for u in result.failed if u.owner is not None}:
            if ref in groups:
                outcome.failed[ref] = EtcdUnavailable(NOT_WRITTEN)
            else:
                outcome.redo[ref] = reasons.get(ref, "retry")
        outcome.error = result.error

    def _log_dry_run(self, plan: Plan) -> None:
        text = format_plan(plan)
        if text != self._last_dry_run:
            logger.info("dry-run: would apply (planned against etcd at revision {})\n{}", plan.revision, text.rstrip())
            self._last_dry_run = text


def log_unrequested(metrics: Metrics, units: list[UnitPlan], groups: Mapping[IngressRef, int], reasons: Mapping[IngressRef, str]) -> None:
    """Log the changes no request asked for (repair, health, reconcile), counting drift repairs."""
    for unit in units:
        if unit.owner in groups:
            continue
        reason = reasons.get(unit.owner) if unit.owner else "shared" if unit.shared else "reconcile"
        if reason is None or reason == "request":  # held keys of a request: logged as requests are, by their txn
            continue
        if reason == "drift":
            metrics.drift_repairs.inc(len(unit.changes))
        for change in unit.changes[:_LOGGED_CHANGES]:
            logger.bind(changed_key=change.key).info("{}: {} {}", reason, change.sign, change.key)


def route(
    units: list[UnitPlan], groups: Mapping[IngressRef, int]
) -> tuple[list[list[UnitPlan]], list[list[UnitPlan]], dict[str, UnitPlan]]:
    """Which units go with the requests (one group per request), which are the leader's own (fenced, one
    group each), and the shared objects they may need (each apply writes one with its first transaction that needs it)."""
    first = min(groups.values(), default=-1)
    pushed: dict[int, list[UnitPlan]] = {}
    own: list[list[UnitPlan]] = []
    shared: dict[str, UnitPlan] = {}
    for unit in units:
        if unit.shared and not unit.standalone:
            shared[unit.shared] = unit
        elif unit.owner is not None and unit.owner in groups:
            pushed.setdefault(groups[unit.owner], []).append(unit)
        elif unit.owner is None and not unit.shared and first >= 0:
            # A root's own keys ride with the first request (create-only: no fence needed).
            pushed.setdefault(first, []).append(unit)
        else:
            own.append([unit])
    return list(pushed.values()), own, shared
