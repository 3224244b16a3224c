"""Passive health on a real Traefik: its JSON access log, real backends, real requests, notifications."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from exporter.daemon import Daemon
from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, free_port
from exporter.etcd.client import EtcdClient
from tests.conftest import access_log_of, settings_for
from tests.helpers import (
    AUTHORITY,
    REPO,
    Backend,
    eventually,
    get_via,
    is_ready,
    start_daemon,
    stop_daemon,
    uid,
)

pytestmark = pytest.mark.integration
TOKEN = "passive-test-token"
FAST = {"enable": True, "interval": 0.2, "max_retries": 2, "max_wait_time": 0.5, "initial_delay": 0}
EJECTION = 5.0
OPENAPI = yaml.safe_load((REPO / "docs" / "openapi.yaml").read_text())


@dataclass
class Receiver:
    """The coordinator's side of health notifications: records every batch; answers 503 while `down`."""

    port: int = field(default_factory=free_port)
    down: bool = False
    batches: list[tuple[float, list[dict[str, Any]]]] = field(default_factory=list)
    refused: int = 0
    auth: Counter[str] = field(default_factory=Counter)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/health-events"

    def events(self, iid: str) -> list[dict[str, Any]]:
        return [e for _, batch in self.batches for e in batch if e["id"] == iid]

    async def handle(self, request: web.Request) -> web.Response:
        self.auth[request.headers.get("Authorization", "")] += 1
        if self.down:
            self.refused += 1
            return web.Response(status=503)
        self.batches.append((time.monotonic(), (await request.json())["events"]))
        return web.Response(status=204)


@pytest.fixture(scope="module")
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/health-events", rec.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", rec.port).start()
    yield rec
    await runner.cleanup()


def passive_settings(etcd: EmbeddedEtcd, log: Path, records: str, **extra: Any) -> Any:
    return settings_for(
        etcd.url, records_prefix=records,
        api={"listen": f"127.0.0.1:{free_port()}", "token": TOKEN},
        control={"listen": f"127.0.0.1:{free_port()}"},
        health={"passive": {"access_log": str(log), "max_failures": 5, "base_ejection_time": EJECTION}, **extra},
    )


@pytest.fixture(scope="module")
async def daemon(etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, workdir: Path, receiver: Receiver) -> AsyncIterator[Daemon]:
    """A daemon with passive health on the session Traefik's access log, notifying `receiver`."""
    (workdir / "notify-token").write_text("notify-secret")
    settings = passive_settings(
        etcd, access_log_of(workdir), uid("passive") + "/records",
        notify_url=receiver.url, notify_token_file=str(workdir / "notify-token"),
    )
    d = Daemon(settings)
    await d.start()
    await d.parts.reconciler.wait_synced(30)
    yield d
    await d.stop()


async def push(http: aiohttp.ClientSession, api: str, *ingresses: dict[str, Any], path: str = "upsert") -> None:
    async with http.post(f"{api}/v2/ingress/{path}", json={"ingresses": list(ingresses)},
                         headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
        assert resp.status == 204, await resp.text()


def ing(iid: str, *urls: str, health: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"authority": AUTHORITY, "id": iid, "revision": 1, "hosts": [f"{iid}.test"],
                            "upstream": {"servers": [{"url": u} for u in urls]}}
    if health is not None:
        body["health_check"] = health
    return body


@pytest.fixture
async def pushed(http: aiohttp.ClientSession, daemon: Daemon) -> AsyncIterator[list[str]]:
    """Ingress ids pushed to `daemon`; removed at teardown."""
    ids: list[str] = []
    yield ids
    if ids:
        await push(http, api_of(daemon), *({"authority": AUTHORITY, "id": i, "revision": 1} for i in ids), path="remove")


def api_of(daemon: Daemon) -> str:
    return f"http://{daemon.settings.api.listen}"


def control_of(daemon: Daemon) -> str:
    return f"http://{daemon.settings.control.listen}"


async def answers(http: aiohttp.ClientSession, traefik: EmbeddedTraefik, iid: str, n: int = 10) -> Counter[str]:
    out: Counter[str] = Counter()
    for _ in range(n):
        status, text = await get_via(http, traefik.url("web"), f"{iid}.test", "/infer")
        out[f"{status} {text}"] += 1
    return out


async def nodes(http: aiohttp.ClientSession, control: str, iid: str) -> dict[int, dict[str, Any]]:
    """Port -> node entry of every checker of one ingress."""
    async with http.get(f"{control}/v1/healthcheck/{AUTHORITY}/{iid}/checkers") as resp:
        assert resp.status == 200, await resp.text()
        entries = await resp.json()
    return {n["port"]: {**n, "type": e["type"]} for e in entries for n in e["nodes"]}


async def metric(http: aiohttp.ClientSession, control: str, name: str) -> float:
    async with http.get(f"{control}/metrics") as resp:
        text = await resp.text()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


async def test_a_server_failing_real_requests_is_ejected_and_returns_once_healthy(
    daemon: Daemon, pushed: list[str], backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession,
    receiver: Receiver,
) -> None:
    bad, good = await Backend("bad").start(), await Backend("good").start()
    backends.extend([bad, good])
    bad.status = 502  # /health still answers 200: the probes alone never eject it
    iid = uid()
    pushed.append(iid)
    ejections_before = await metric(http, control_of(daemon), "exporter_health_passive_ejections_total")
    await push(http, api_of(daemon), ing(iid, bad.url, good.url, health=FAST))
    await eventually(lambda: _seen(answers(http, traefik, iid), "502 bad", "200 good"))

    await eventually(lambda: _only(answers(http, traefik, iid, 20), "200 good"), timeout=10)
    assert bad.hits["/infer"] >= 5  # max_failures, plus what was in flight until the ejection was served
    node = (await nodes(http, control_of(daemon), iid))[bad.port]
    assert node["status"] == "healthy", node  # the probes say healthy...
    assert "passive_ejection" in node and node["counter"]["passive_failure"] == 0, node  # ...passive health ejected it
    assert await metric(http, control_of(daemon), "exporter_health_passive_ejections_total") == ejections_before + 1
    assert await metric(http, control_of(daemon), "exporter_health_passive_failures_total") >= 5

    bad.status = 200
    returned = await eventually(lambda: _seen(answers(http, traefik, iid), "200 bad", "200 good"), timeout=EJECTION + 10)
    assert returned
    assert "passive_ejection" not in (await nodes(http, control_of(daemon), iid))[bad.port]
    events = await eventually(lambda: _events(receiver, iid, bad.url, 3))
    assert [(e["from"], e["to"]) for e in events] == [
        ("not_routed", "routed"), ("routed", "not_routed"), ("not_routed", "routed"),
    ]
    assert events[1]["reason"].startswith("passive: ") and events[2]["reason"] == "passive: ejection ended"
    assert {e["group"] for e in events} == {"primary"} and events[1]["authority"] == AUTHORITY
    assert set(receiver.auth) == {"Bearer notify-secret"}


async def test_a_group_of_two_never_loses_its_last_server(
    daemon: Daemon, pushed: list[str], backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    first, second = await Backend("first").start(), await Backend("second").start()
    backends.extend([first, second])
    first.status = second.status = 502
    iid = uid()
    pushed.append(iid)
    await push(http, api_of(daemon), ing(iid, first.url, second.url))  # no active checks: passive only
    await eventually(lambda: _seen(answers(http, traefik, iid), "502 first", "502 second"))

    async def one_ejected() -> dict[int, dict[str, Any]] | None:
        await answers(http, traefik, iid, 2)  # traffic keeps coming
        found = await nodes(http, control_of(daemon), iid)
        return found if sum("passive_ejection" in n for n in found.values()) == 1 else None

    found = await eventually(one_ejected)
    assert {n["type"] for n in found.values()} == {"passive"}
    kept = next(port for port, n in found.items() if "passive_ejection" not in n)
    survivor = "first" if kept == first.port else "second"
    await eventually(lambda: _only(answers(http, traefik, iid, 5), f"502 {survivor}"))
    got = await answers(http, traefik, iid, 20)  # the survivor keeps taking traffic: never 503
    assert got == Counter({f"502 {survivor}": 20}), got
    # The access log is read as Traefik writes it: the count catches up with the requests.
    await eventually(lambda: _failures(http, control_of(daemon), iid, kept, 5))


async def test_the_access_log_is_followed_across_rotation_and_truncation(
    daemon: Daemon, pushed: list[str], backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession,
    workdir: Path,
) -> None:
    only = await Backend("only").start()
    backends.append(only)
    only.status = 502  # the group's last server: counted, never ejected
    iid = uid()
    pushed.append(iid)
    await push(http, api_of(daemon), ing(iid, only.url))
    await eventually(lambda: _seen(answers(http, traefik, iid, 1), "502 only"))
    control = control_of(daemon)
    await eventually(lambda: _failures(http, control, iid, only.port, 1))
    start = (await nodes(http, control, iid))[only.port]["counter"]["passive_failure"]

    log = access_log_of(workdir)
    log.rename(log.with_suffix(".1"))
    os.kill(traefik.proc.pid, signal.SIGUSR1)  # what logrotate does: Traefik reopens its log path
    await eventually(lambda: _exists(log))
    await answers(http, traefik, iid, 3)
    await eventually(lambda: _failures(http, control, iid, only.port, start + 3))

    with log.open("r+b") as f:
        f.truncate(0)
    await answers(http, traefik, iid, 2)
    await eventually(lambda: _failures(http, control, iid, only.port, start + 5))


async def test_a_restart_does_not_replay_old_lines(
    etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, backends: list[Backend], http: aiohttp.ClientSession, workdir: Path
) -> None:
    only = await Backend("only").start()
    backends.append(only)
    only.status = 502
    iid = uid()
    settings = passive_settings(etcd, access_log_of(workdir), uid("replay") + "/records")
    first = Daemon(settings)
    await first.start()
    await first.parts.reconciler.wait_synced(30)
    try:
        await push(http, api_of(first), ing(iid, only.url))
        await eventually(lambda: _seen(answers(http, traefik, iid, 1), "502 only"))
        await answers(http, traefik, iid, 3)
        await eventually(lambda: _failures(http, control_of(first), iid, only.port, 4))
    finally:
        await first.stop()
    second = Daemon(settings)
    await second.start()
    await second.parts.reconciler.wait_synced(30)
    try:
        await eventually(lambda: is_ready(http, control_of(second)))
        await answers(http, traefik, iid, 1)
        await eventually(lambda: _failures(http, control_of(second), iid, only.port, 1))
        assert (await nodes(http, control_of(second), iid))[only.port]["counter"]["passive_failure"] == 1
    finally:
        await push(http, api_of(second), {"authority": AUTHORITY, "id": iid, "revision": 1}, path="remove")
        await second.stop()


async def test_three_sidecars_a_followers_traffic_ejects_and_a_dead_sidecars_runs_expire(
    tmp_path: Path, etcd: EmbeddedEtcd, etcd_client: EtcdClient, traefik: EmbeddedTraefik, workdir: Path,
    backends: list[Backend], http: aiohttp.ClientSession,
) -> None:
    bad, good = await Backend("bad").start(), await Backend("good").start()
    backends.extend([bad, good])
    bad.status = 502
    space = uid("trio")
    config = tmp_path / "exporter.yaml"
    config.write_text(
        f'etcd: {{endpoints: ["{etcd.url}"]}}\nrecords_prefix: "{space}/records"\nleader: {{ttl: 3}}\n'
        f"health: {{passive: {{max_failures: 5, base_ejection_time: 30}}}}\n"
    )
    sidecars: list[tuple[Any, str, str]] = []
    try:
        # The leader's own Traefik sees no traffic; only the first follower's does.
        for n, log in enumerate([tmp_path / "quiet-0.json", access_log_of(workdir), tmp_path / "quiet-2.json"]):
            api, control = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
            env = {"EXPORTER_API__TOKEN": TOKEN, "EXPORTER_API__LISTEN": api, "EXPORTER_CONTROL__LISTEN": control,
                   "EXPORTER_HEALTH__PASSIVE__ACCESS_LOG": str(log)}
            proc = start_daemon(config, tmp_path / f"sidecar{n}.log", env=env)
            sidecars.append((proc, f"http://{api}", f"http://{control}"))
            await eventually(lambda: is_ready(http, f"http://{control}"), timeout=30)
            if n == 0:
                await eventually(lambda: _value(metric(http, f"http://{control}", "exporter_leader"), 1))
        (_, _, leader), (follower, follower_api, follower_control) = sidecars[0], sidecars[1][:3]
        iid = uid()
        await push(http, follower_api, ing(iid, bad.url, good.url))
        await eventually(lambda: _seen(answers(http, traefik, iid), "502 bad", "200 good"))
        await eventually(lambda: _only(answers(http, traefik, iid, 20), "200 good"), timeout=10)
        assert "passive_ejection" in (await nodes(http, leader, iid))[bad.port]
        await eventually(lambda: _ejected(http, follower_control, iid, bad.port))  # one published truth

        # A run the follower reports dies with it: its report key goes when its lease expires.
        dead = f"http://127.0.0.1:{free_port()}"  # refused: a third server, never ejected (rails: 1 of 3)
        await push(http, follower_api, {**ing(iid, good.url, bad.url, dead), "revision": 2})
        await eventually(lambda: _seen(answers(http, traefik, iid, 20), "502 Bad Gateway"))
        report = f"{space}/records.health.passive/"
        await eventually(lambda: _reported(etcd_client, report, True))
        follower.kill()
        await eventually(lambda: _reported(etcd_client, report, False), timeout=15)
        await push(http, sidecars[0][1], {"authority": AUTHORITY, "id": iid, "revision": 2}, path="remove")
    finally:
        for proc, _, _ in sidecars:
            stop_daemon(proc)
        await etcd_client.delete_prefix(f"{space}/")
        await etcd_client.delete_prefix(f"{space}/records.")


async def test_notifications_reach_a_receiver_that_was_down_once_and_in_order(
    daemon: Daemon, pushed: list[str], backends: list[Backend], http: aiohttp.ClientSession, receiver: Receiver
) -> None:
    flappy = await Backend("flappy").start()
    backends.append(flappy)
    receiver.down = True
    refused = receiver.refused
    iid = uid()
    pushed.append(iid)
    await push(http, api_of(daemon), ing(iid, flappy.url, health=FAST))
    await eventually(lambda: _node_status(http, control_of(daemon), iid, flappy.port, "healthy"))
    flappy.health = 503
    await eventually(lambda: _node_status(http, control_of(daemon), iid, flappy.port, "unhealthy"))
    flappy.health = 200
    await eventually(lambda: _node_status(http, control_of(daemon), iid, flappy.port, "healthy"))
    await eventually(lambda: _more(receiver, refused + 2), timeout=10)  # retried while down, with backoff
    assert receiver.events(iid) == []
    receiver.down = False
    events = await eventually(lambda: _events(receiver, iid, flappy.url, 3), timeout=40)
    assert [(e["from"], e["to"]) for e in events] == [
        ("not_routed", "routed"), ("routed", "not_routed"), ("not_routed", "routed"),
    ]
    assert [e["reason"] for e in events] == ["active: success", "active: http_failure", "active: success"]
    assert events == sorted(events, key=lambda e: e["at"])
    jsonschema.validate({"events": events}, {**OPENAPI["components"]["schemas"]["HealthEvents"], "components": OPENAPI["components"]})
    starts = [t for t, _ in receiver.batches]
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(starts)), starts  # at most one request per second


async def _seen(coro: Any, *wanted: str) -> bool:
    got = await coro
    return all(w in got for w in wanted)


async def _only(coro: Any, wanted: str) -> bool:
    got = await coro
    assert set(got) == {wanted}, got
    return True


async def _exists(path: Path) -> bool:
    return path.exists()


async def _value(coro: Any, expected: float) -> bool:
    return bool(await coro == expected)


async def _failures(http: aiohttp.ClientSession, control: str, iid: str, port: int, n: int) -> bool:
    node = (await nodes(http, control, iid)).get(port)
    assert node is not None and node["counter"]["passive_failure"] >= n, node
    return True


async def _ejected(http: aiohttp.ClientSession, control: str, iid: str, port: int) -> bool:
    node = (await nodes(http, control, iid)).get(port)
    return node is not None and "passive_ejection" in node


async def _node_status(http: aiohttp.ClientSession, control: str, iid: str, port: int, status: str) -> bool:
    node = (await nodes(http, control, iid)).get(port)
    return node is not None and node["status"] == status


async def _events(receiver: Receiver, iid: str, node: str, n: int) -> list[dict[str, Any]] | None:
    events = [e for e in receiver.events(iid) if e["node"] == node]
    assert len(events) <= n, events
    return events if len(events) == n else None


async def _more(receiver: Receiver, n: int) -> bool:
    return receiver.refused >= n


async def _reported(client: EtcdClient, prefix: str, present: bool) -> bool:
    return bool((await client.range_prefix(prefix)).kvs) is present
