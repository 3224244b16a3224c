"""Supervised tasks: a crash is logged with its traceback, counted, restarted; one that keeps failing is named.

And a checker plugin whose probe raises counts as a failed probe of that target, while checking goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import aiohttp
import pytest
from loguru import logger

from exporter.daemon import Daemon
from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, free_port
from exporter.health.checkers import CheckConfig, CheckerTarget, Node
from exporter.health.engine import HealthEngine
from exporter.health.state import State
from exporter.ingress import HealthCheck, Ingress, PluginUpstream
from exporter.keys import IngressRef
from exporter.metrics import Metrics
from exporter.supervisor import Supervisor
from tests.conftest import settings_for
from tests.helpers import eventually, holds, uid


@pytest.fixture
def logged() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda message: lines.append(str(message)), level="INFO", format="{message}\n{exception}")
    yield lines
    logger.remove(sink)


def _restarts(supervisor: Supervisor, group: str) -> float:
    return supervisor.metrics.value("exporter_task_restarts_total", {"task": group})


async def test_a_crash_is_logged_with_its_traceback_counted_and_restarted(logged: list[str]) -> None:
    supervisor = Supervisor(backoff_first=0.01, backoff_max=0.02)
    runs = 0
    done = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("boom in the first run")
        done.set()
        await asyncio.Event().wait()

    # The series exists at 0 before the first crash, so increase() sees that crash.
    labelled = {"task": "flaky"}
    assert supervisor.metrics.registry.get_sample_value("exporter_task_restarts_total", labelled) is None
    task = supervisor.spawn("flaky", flaky)
    assert supervisor.metrics.registry.get_sample_value("exporter_task_restarts_total", labelled) == 0
    await asyncio.wait_for(done.wait(), 5)
    assert runs == 2 and _restarts(supervisor, "flaky") == 1
    crash = next(line for line in logged if "task flaky crashed" in line)
    assert "Traceback" in crash and "boom in the first run" in crash
    # One crash, then running: not failing.
    assert supervisor.readiness() == []
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_task_that_keeps_failing_is_named_until_a_run_lasts() -> None:
    supervisor = Supervisor(backoff_first=0.01, backoff_max=0.02, healthy_run=0.5)
    broken = True

    async def failing() -> None:
        if broken:
            raise ValueError("still broken")
        await asyncio.Event().wait()

    task = supervisor.spawn("failing", failing, group="checks")
    await eventually(lambda: holds(_restarts(supervisor, "checks") >= 3))
    [reason] = supervisor.readiness()
    assert reason.startswith("task failing keeps failing (") and reason.endswith(" crashes in a row): ValueError: still broken")
    broken = False
    # Runs again: still named until the run has lasted `healthy_run`, then no longer.
    await eventually(lambda: holds(supervisor.readiness() == []), timeout=5)
    assert not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_task_that_returns_is_done_and_a_cancelled_one_is_not_restarted() -> None:
    supervisor = Supervisor(backoff_first=0.01)
    runs = 0

    async def once() -> None:
        nonlocal runs
        runs += 1

    await supervisor.spawn("once", once)
    assert runs == 1
    running = asyncio.Event()

    async def blocking() -> None:
        running.set()
        await asyncio.Event().wait()

    blocked = supervisor.spawn("blocked", blocking)
    await running.wait()
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    assert supervisor.readiness() == []


class RaisingKind:
    """A plugin kind whose probe raises until `fixed` (then succeeds)."""

    kind = "raising"

    def __init__(self) -> None:
        self.fixed = False
        self.calls = 0

    async def probe(self, node: Node, check: CheckConfig) -> Any:
        self.calls += 1
        if not self.fixed:
            raise KeyError("the plugin has a bug")
        return "success"

    def targets(self, group: PluginUpstream, resource: str, defaults: HealthCheck, protocol: str = "http") -> list[CheckerTarget]:
        check = CheckConfig(type="http", interval=0.05, timeout=0.5, max_retries=2, initial_delay=0)
        return [CheckerTarget(name=f"{resource}/0", nodes=(Node(group.servers[0].url),), check=check, plugin="raising", probe=self.probe)]


class Replans:
    def __init__(self) -> None:
        self.refs: list[IngressRef] = []

    def mark_dirty(self, refs: Sequence[IngressRef], reason: str) -> None:
        self.refs.extend(refs)


async def test_a_plugin_probe_that_raises_is_a_failed_probe_and_checking_goes_on(logged: list[str]) -> None:
    kind = RaisingKind()
    metrics = Metrics()
    engine = HealthEngine({"raising": kind}, Replans(), metrics=metrics)
    ref = IngressRef("test", "raising")
    url = "http://127.0.0.1:9"
    upstream = {"kind": "raising", "servers": [{"url": url}]}
    ingress = Ingress.model_validate({"authority": "test", "id": "raising", "revision": 1, "hosts": ["raising.test"], "upstream": upstream})
    engine.update(ref, ingress)
    await engine.start()
    try:
        await eventually(lambda: holds(kind.calls >= 4))
        node = engine.node(ref, url)
        assert node is not None and node.state == State.UNHEALTHY and node.counter()["http_failure"] >= 2
        assert url in engine.ejected(ref, ingress)
        assert metrics.value("exporter_health_plugin_errors_total", {"plugin": "raising"}) >= 4
        # Logged once with its traceback, not once per probe.
        raised = [line for line in logged if "plugin raising raised probing" in line]
        assert len(raised) == 1 and "KeyError" in raised[0] and "Traceback" in raised[0]
        kind.fixed = True
        await eventually(lambda: holds(url not in engine.ejected(ref, ingress)))
        assert any("plugin raising probes" in line and "again" in line for line in logged)
    finally:
        await engine.stop()


@pytest.mark.integration
async def test_a_daemon_task_that_keeps_failing_shows_in_readyz_and_metrics(
    etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = f"127.0.0.1:{free_port()}"
    settings = settings_for(
        etcd.url, records_prefix=f"{uid('sup')}/records", api={"enabled": False}, control={"listen": control},
        traefik={"api_url": traefik.api},
    )
    daemon = Daemon(settings)
    assert daemon.parts.observer is not None

    async def broken() -> None:
        raise RuntimeError("observer bug")

    monkeypatch.setattr(daemon.parts.observer, "run", broken)
    await daemon.start()
    try:
        await eventually(lambda: _readyz_names(http, control, "task traefik-observer keeps failing"), timeout=20)
        async with http.get(f"http://{control}/metrics") as resp:
            text = await resp.text()
        line = next(x for x in text.splitlines() if x.startswith('exporter_task_restarts_total{task="traefik-observer"}'))
        assert float(line.rsplit(" ", 1)[1]) >= 3
    finally:
        await daemon.stop()


async def _readyz_names(http: aiohttp.ClientSession, control: str, reason: str) -> bool:
    async with http.get(f"http://{control}/readyz") as resp:
        reasons: list[str] = (await resp.json())["reasons"]
        return resp.status == 503 and any(r.startswith(reason) and "RuntimeError: observer bug" in r for r in reasons)
