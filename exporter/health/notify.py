"""Health changes pushed to the coordinator: every routed / not-routed transition of a node, POSTed as JSON.

Only the leader makes transitions, so only the leader sends. Events are sent in the order they
happened, in batches (at most one request per `min_interval`); a batch the receiver did not
answer with 2xx is sent again (with the events that came since) after a growing backoff, and
is dropped from the queue only after a 2xx, so the receiver sees each event once unless an answer
it sent is lost on the way (then the batch comes again: events carry `at` to tell).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import islice
from typing import Any, Protocol

import aiohttp
from loguru import logger

from ..ingress import Ingress
from ..keys import IngressRef
from ..metrics import Metrics
from ..roles import LeaderPolicy
from ..tracing.hooks import NO_TRACING, Tracing
from .passive import group_of


class Transitions(Protocol):
    """Where the health engine reports a node starting or stopping being routed."""

    def transition(self, owner: IngressRef, node: str, routed: bool, reason: str) -> None:
        """`node` (a server or instance URL) of `owner` is now routed (or not), because of `reason`."""
        ...


def _state(routed: bool) -> str:
    return "routed" if routed else "not_routed"


class Notifier:
    """Queues transitions (leader only) and delivers them to `url` in order, batched and retried."""

    def __init__(
        self, url: str, token: str | None, leader: LeaderPolicy, ingress_of: Callable[[IngressRef], Ingress | None], *,
        min_interval: float = 1.0, max_backoff: float = 30.0, timeout: float = 10.0, max_batch: int = 1000,
        metrics: Metrics | None = None, tracing: Tracing = NO_TRACING,
    ) -> None:
        """`tracing`: each request is a CLIENT span carrying `traceparent`, linked to the probes whose changes it tells."""
        self._url = url
        self._tracing = tracing
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._leader = leader
        self._ingress_of = ingress_of
        self._min_interval = min_interval
        self._max_backoff = max_backoff
        self._timeout = timeout
        self._max_batch = max_batch
        self._pending: deque[dict[str, Any]] = deque()
        # Beside each pending event: the span of the probe that caused it, to link to (tracing/hooks.py).
        self._links: deque[Any] = deque()
        self._wake = asyncio.Event()
        self._metrics = metrics or Metrics()
        self._metrics.notifications_pending.read_from(lambda: [((), float(len(self._pending)))])

    def transition(self, owner: IngressRef, node: str, routed: bool, reason: str) -> None:
        """Queue one event (ignored when this exporter is not the leader)."""
        if not self._leader.is_leader():
            return
        self._pending.append({
            "authority": owner.authority, "id": owner.id, "group": group_of(self._ingress_of(owner), node), "node": node,
            "from": _state(not routed), "to": _state(routed), "reason": reason,
            "at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        })
        self._links.append(self._tracing.linked())
        self._wake.set()

    async def run(self) -> None:
        """Deliver queued events until cancelled."""
        backoff = 0.5
        last = -self._min_interval
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout)) as session:
            while True:
                await self._wake.wait()
                await asyncio.sleep(max(0.0, last + self._min_interval - time.monotonic()))
                if not self._leader.is_leader():
                    logger.warning("no longer the leader: {} health notifications dropped", len(self._pending))
                    self._pending.clear()
                    self._links.clear()
                else:
                    batch = list(islice(self._pending, self._max_batch))
                    links = [link for link in islice(self._links, len(batch)) if link is not None]
                    last = time.monotonic()
                    if await self._send(session, batch, links):
                        for _ in batch:
                            self._pending.popleft()
                            self._links.popleft()
                        self._metrics.notifications.inc(len(batch))
                        backoff = 0.5
                    else:
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, self._max_backoff)
                if not self._pending:
                    self._wake.clear()

    async def _send(self, session: aiohttp.ClientSession, batch: list[dict[str, Any]], links: list[Any]) -> bool:
        with self._tracing.notification(self._url, len(batch), links) as call:
            try:
                async with session.post(self._url, json={"events": batch}, headers={**self._headers, **call.headers}) as response:
                    call.answered(response.status)
                    if 200 <= response.status < 300:
                        return True
                    reason = f"HTTP {response.status}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                reason = type(exc).__name__
                call.failed(reason)
        self._metrics.notification_failures.inc()
        logger.warning("health notification of {} events not delivered ({}); will retry", len(batch), reason)
        return False
