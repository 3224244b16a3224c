"""Runs passive health: follows the access log, shares this sidecar's failure runs, and (leader) ejects and returns servers.

Passive ejections take the same path as the probes' (`HealthEngine.routing_changed`: the
ingress is planned again and written by the guarded writer, the document is published,
the coordinator notified), so followers render them from the published documents too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from loguru import logger

from ..ingress import Ingress
from ..keys import IngressRef
from ..roles import LeaderPolicy
from .accesslog import LogFollower, classify
from .engine import HealthEngine
from .passive import PassiveHealth, server_urls
from .reports import PassiveReports

# How often the leader looks for ejections whose time is over.
_TICK = 0.25
# Reports are batched: one write per this many seconds at most while failures keep coming.
_REPORT_EVERY = 0.2


class PassiveMonitor:
    """The passive-health tasks of one sidecar."""

    def __init__(
        self, passive: PassiveHealth, engine: HealthEngine, leader: LeaderPolicy, *,
        ingress_of: Callable[[IngressRef], Ingress | None],
        follower: LogFollower | None, reports: PassiveReports | None, clock: Callable[[], float] = time.time,
    ) -> None:
        self.passive = passive
        self._engine = engine
        self._leader = leader
        self._ingress_of = ingress_of
        self._follower = follower
        self._reports = reports
        self._clock = clock
        self._report_due = asyncio.Event()
        if follower is not None:
            follower.open_at_end()  # a restart never replays old lines

    async def run(self) -> None:
        """Run every passive task until cancelled."""
        tasks = [self._tick()]
        if self._follower is not None:
            tasks.append(self._follow_log(self._follower))
        if self._reports is not None:
            tasks += [self._reports.follow(self._peer_report), self._publish_reports(self._reports)]
        try:
            await asyncio.gather(*tasks)
        finally:
            if self._follower is not None:
                self._follower.close()

    async def _follow_log(self, follower: LogFollower) -> None:
        statuses = self.passive.policy.failure_statuses
        async for lines in follower.batches():
            requests = [r for line in lines if (r := classify(line, statuses)) is not None]
            changed = self.passive.observe(requests, lambda owner: server_urls(self._ingress_of(owner)), self._clock())
            if changed:
                self._report_due.set()
                self._decide(changed)

    async def _publish_reports(self, reports: PassiveReports) -> None:
        # Followers publish; the leader decides from its own runs directly.
        while True:
            await self._report_due.wait()
            await asyncio.sleep(_REPORT_EVERY)
            self._report_due.clear()
            if not self._leader.is_leader() and not await reports.publish(self.passive.report()):
                self._report_due.set()
                await asyncio.sleep(1)

    def _peer_report(self, identity: str, runs: list[list[Any]] | None) -> None:
        if self._reports is not None and identity == self._reports.identity:
            return
        try:
            changed = self.passive.set_peer(identity, runs)
        except (TypeError, ValueError):
            logger.error("ignoring the malformed passive report of {}", identity)
            return
        self._decide(changed)

    def follow_leader(self, docs: dict[IngressRef, dict[str, Any]]) -> None:
        """A follower drops its runs of servers the leader has ejected since they began (their count restarts)."""
        if self._leader.is_leader():
            return
        if self.passive.follow_leader(docs):
            self._report_due.set()

    def _decide(self, owners: set[IngressRef]) -> None:
        if not self._leader.is_leader():
            return
        now = self._clock()
        for owner in owners:
            ingress = self._ingress_of(owner)
            if ingress is None:
                continue
            active = self._engine.active_ejected(owner, ingress)
            for group, url, reason in list(self.passive.decide(owner, ingress, active, now)):
                until = self.passive.ejections[owner][url].until
                logger.info("health: passive: {}/{} {} ejected for {:.0f}s ({})", owner, group, url, until - now, reason)
                self._engine.routing_changed(owner, url, False, reason)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(_TICK)
            if self._leader.is_leader():
                self.release_due(self._clock())

    def release_due(self, now: float) -> None:
        """Return the servers whose ejection is over: at once without active checks, else after a probe passes."""
        for owner, url, ejection in list(self.passive.due(now)):
            node = self._engine.node(owner, url)
            if node is not None and ejection.expired_at is None:
                ejection.expired_at = now
                continue
            if node is not None and not self._engine.probe_passed_since(owner, url, ejection.expired_at or now):
                continue
            self.passive.release(owner, url, now)
            routed = node is None or node.routed
            logger.info("health: passive: {} {} returns ({})", owner, url, "probe passed" if node else "ejection time over")
            self._engine.routing_changed(owner, url, routed, "passive: ejection ended", announce=routed)
