"""Probing on a schedule: one node at a time through a shared bound, one target per task.

A target's task probes its nodes (with sharding on, this sidecar's share of them) every interval (jittered by 5 %, the first probe within a
second and spread so thousands of targets do not fire at once) and updates each node's state
machine; a node whose routing changes is reported through `changed`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

from loguru import logger

from ..metrics import Metrics
from .checkers import CheckerTarget, Node
from .probes import AGENT, http_probe, tcp_probe
from .report import Checked
from .state import NodeHealth, Thresholds


class Prober:
    """Probes one node of a target, at most `concurrency` at once; a plugin that raises is a failed probe."""

    def __init__(self, concurrency: int, metrics: Metrics, identity: str | None = None) -> None:
        self._limit = asyncio.Semaphore(concurrency)
        self._agent = f"{AGENT} ({identity})" if identity else AGENT
        self._plugin_errors = metrics.plugin_errors
        # Targets and nodes whose plugin raised (logged once, until it answers again).
        self._raising: set[str] = set()

    def forget(self, target_name: str) -> None:
        """A target is gone: forget its raising nodes."""
        if self._raising:
            self._raising = {w for w in self._raising if not w.startswith(target_name + " ")}

    async def probe(self, target: CheckerTarget, node: Node) -> Any:
        """The outcome of one probe of `node`."""
        async with self._limit:
            if target.probe is not None:
                return await self._plugin_probe(target, node)
            if target.check.type == "tcp":
                return await tcp_probe(node, target.check)
            return await http_probe(node, target.check, self._agent)

    async def _plugin_probe(self, target: CheckerTarget, node: Node) -> Any:
        # A plugin's probe that raises is a failed probe of that node; checking goes on.
        assert target.probe is not None
        where = f"{target.name} {node.url}"
        # The plugin's series exists at 0 from its first probe, so the first error shows in rate().
        errors = self._plugin_errors.labels(target.plugin or "unnamed")
        try:
            outcome = await target.probe(node, target.check)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop checking its target
            errors.inc()
            if where not in self._raising:
                self._raising.add(where)
                logger.opt(exception=exc).error("health: plugin {} raised probing {}; counted as a failed probe", target.plugin, where)
            return "tcp_failure" if target.check.type == "tcp" else "http_failure"
        if where in self._raising:
            self._raising.discard(where)
            logger.info("health: plugin {} probes {} again", target.plugin, where)
        return outcome


async def probe_target(
    checked_now: Callable[[], Checked | None], prober: Prober, clock: Callable[[], float], metrics: Metrics,
    changed: Callable[[str, NodeHealth, str, int, bool], None],
) -> None:
    """Probe one target every interval until `checked_now()` no longer finds it (it reads the node set anew each time).

    `changed` is told of every state change, and of the first probe of a node adopted: the node, its health, the
    probe's outcome, when the probe started (ns) and whether the node's routing changed.
    """
    checked = checked_now()
    if checked is None:
        return
    # First probe within a second (new servers get no traffic until it succeeds), spread
    # over the interval so thousands of targets do not fire in one burst every period.
    due = clock() + random.uniform(0, min(1.0, checked.target.check.interval))
    while True:
        await asyncio.sleep(max(0.0, due - clock()))
        checked = checked_now()
        if checked is None:
            return
        metrics.schedule_lag.observe(max(0.0, clock() - due))
        target, check = checked.target, checked.target.check
        started = time.time_ns()
        nodes = checked.probed_nodes()
        # One node (the common case) is awaited in place: a task per probe would cost as much as the probe.
        outcomes = [await prober.probe(target, nodes[0])] if len(nodes) == 1 else \
            await asyncio.gather(*(prober.probe(target, node) for node in nodes))
        now = clock()
        limits = Thresholds(successes=1, failures=check.max_retries, initial_delay=check.initial_delay)
        for node, outcome in zip(nodes, outcomes, strict=True):
            health = checked.nodes.get(node.url)
            if health is None:
                continue
            metrics.health_probes.labels(outcome).inc()
            health.checked_at, health.last_outcome = time.time(), str(outcome)
            if outcome == "success":
                health.success_at = health.checked_at
            state = health.state
            if routed := health.record(outcome, now, limits):
                metrics.health_transitions.labels(health.state.value).inc()
            if routed or health.state is not state or health.unreported:
                health.unreported = False
                changed(node.url, health, str(outcome), started, routed)
        due += check.interval * random.uniform(0.95, 1.05)
        due = max(due, clock())
