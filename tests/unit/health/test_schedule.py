"""The probe loop's reports (`probe_target`): state changes, and the first probe of a node adopted."""

from __future__ import annotations

import time
from typing import Any

from exporter.health.checkers import CheckConfig, CheckerTarget, Node
from exporter.health.report import Checked
from exporter.health.schedule import Prober, probe_target
from exporter.health.state import NodeHealth, State
from exporter.metrics import Metrics

URL = "http://10.0.0.1:80"


async def _reports(health: NodeHealth, probes: int) -> list[State]:
    """The states `changed` was told of over `probes` successful probes of one node."""

    async def succeed(_node: Node, _check: CheckConfig) -> Any:
        return "success"

    target = CheckerTarget("t", (Node(URL),), CheckConfig(interval=0.001, initial_delay=0), plugin="always", probe=succeed)
    checked = Checked(target, {URL: health})
    done: list[int] = []
    told: list[State] = []

    def now() -> Checked | None:
        done.append(1)
        return checked if len(done) <= probes + 1 else None  # once before the first sleep, then once per probe

    def changed(_url: str, node: NodeHealth, _outcome: str, _started: int, _routed: bool) -> None:
        told.append(node.state)

    await probe_target(now, Prober(4, Metrics()), time.monotonic, Metrics(), changed)
    return told


async def test_only_a_change_of_state_is_reported() -> None:
    health = NodeHealth(added_at=0)
    assert await _reports(health, 3) == [State.HEALTHY]  # the first success; the next two change nothing
    assert await _reports(health, 2) == []


async def test_the_first_probe_of_an_adopted_node_is_reported_though_its_state_holds() -> None:
    """The state adopted may be older than the verdict the leader reaches once it has read on: the
    new owner reports what it finds at once, with its own probe's time, or the verdict could stay stale."""
    health = NodeHealth(added_at=0)
    health.adopt({"status": "healthy", "counter": {"success": 1}}, True, 0)
    assert health.state is State.HEALTHY
    assert await _reports(health, 3) == [State.HEALTHY]
    assert not health.unreported and health.checked_at > 0
    assert await _reports(health, 2) == []
