"""The dashboard and the alert rules against a real Prometheus scraping a real daemon (Debian's `prometheus`).

Everything around the daemon is real and its own, so the test may stop it: etcd, a Traefik on that
etcd (its API observed, its JSON access log read by passive health), a Redis holding the
registration, a coordinator receiving health notifications. Prometheus finds the daemon as
Backend.AI's monitoring would: over HTTP service discovery (`http_sd_configs`), from the
`prometheus_address` the daemon registered in Redis. It scrapes every second and evaluates
deploy/prometheus/alerts.yml every second.

The scenario: pushes, requests through Traefik to a failing server, pushes with a wrong token and a
bad one, a health-checked server going down, etcd stopped for a while and started again. Then
every panel of deploy/grafana/traefik-etcd-exporter.json must have returned data, the panels the
scenario lights must have shown it, and the alerts Prometheus raised (its `ALERTS` series) must be
exactly the scenario's.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from exporter.daemon import Daemon
from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, free_port, start_etcd, start_traefik
from exporter.etcd.types import b64
from exporter.keys import OWNER_KEY
from exporter.render.root_keys import OWNER_VALUE
from tests.conftest import ROOT, settings_for
from tests.deploy.prometheus_package import debian_binary
from tests.helpers import AUTHORITY, REPO, Backend, eventually, get_via, holds, serve_all_paths, serves, tls_backend_context, uid
from tests.redis_server import RedisServer, start_redis

pytestmark = pytest.mark.integration

RULES = REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "traefik-etcd-exporter.json"
JOB = "traefik-etcd-exporter"
TOKEN = "prometheus-test-token"
GROUP = "appproxy-worker"
FAST = {"enable": True, "interval": 0.2, "max_retries": 2, "max_wait_time": 0.5, "initial_delay": 0}

# The alerts each step should raise (pending: their `for:` is minutes; PassiveEjections fires at once).
RAISED_BY = {
    "requests through Traefik to a failing server": {"PassiveEjections"},
    "pushes with a wrong token, and a bad push": {"ExporterPushesUnauthorized"},
    "a health-checked server goes down": {"UpstreamsEjected"},
    # An idle daemon's outage shows as not ready (a push meanwhile is refused before anything is
    # sent, so no etcd request fails: ExporterEtcdErrors is for failing writes); once the
    # leader's lease has lapsed (leader.ttl) nobody leads.
    "etcd stopped for a while": {"ExporterNotReady", "ExporterNoLeader"},
}
# Panels that may stay 0 through this scenario (they still return data): what lights them is
# another scenario, each with its own test on the real thing: a frozen Traefik, a burst behind a
# slow Traefik, someone editing owned keys, Redis refusing writes, a crash, etcd failing a write
# (an idle daemon's outage fails none). Traefik's lag shows only if a scrape lands within the
# ~0.1 s Traefik takes to apply a commit.
MAY_STAY_ZERO = {
    "Blocking keys", "Paced ingresses", "Drift repairs", "Discovery write errors", "Task crashes", "Traefik lag",
    "etcd errors", "Mirror listings",
}


@dataclass
class World:
    """What the daemon runs next to, all its own."""

    etcd: EmbeddedEtcd
    traefik: EmbeddedTraefik
    redis: RedisServer
    access_log: Path
    ca_dir: Path
    notified: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    (tmp_path / "etcd").mkdir()
    etcd = start_etcd(tmp_path / "etcd")
    # The root's sentinel first, as conftest does: Traefik's provider backs off on an empty prefix.
    put = json.dumps({"key": b64(f"{ROOT}/{OWNER_KEY}"), "value": b64(OWNER_VALUE)}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{etcd.url}/v3/kv/put", data=put), timeout=30) as resp:
        resp.read()
    access_log = tmp_path / "access.json"
    (tmp_path / "traefik").mkdir()
    traefik = start_traefik(tmp_path / "traefik", etcd.url, ROOT, ["web"],
                            extra_args=[f"--accessLog.filePath={access_log}", "--accessLog.format=json"])
    (tmp_path / "redis").mkdir()
    redis = start_redis(tmp_path / "redis")
    (tmp_path / "ca").mkdir()
    yield World(etcd, traefik, redis, access_log, tmp_path / "ca")
    redis.stop()
    traefik.stop()
    etcd.stop()


@pytest.fixture
async def coordinator(world: World) -> AsyncIterator[str]:
    """Receives health notifications; the URL to give the daemon."""
    async def handle(request: web.Request) -> web.Response:
        world.notified.extend((await request.json())["events"])
        return web.Response(status=204)

    port = free_port()
    runner = await serve_all_paths(port, handle)
    yield f"http://127.0.0.1:{port}/health-events"
    await runner.cleanup()


@pytest.fixture
async def daemon(world: World, coordinator: str) -> AsyncIterator[Daemon]:
    api = f"127.0.0.1:{free_port()}"
    settings = settings_for(
        world.etcd.url, etcd={"endpoints": [world.etcd.url], "timeout": 1.0},
        api={"listen": api, "token": TOKEN}, control={"listen": f"127.0.0.1:{free_port()}"},
        traefik={"api_url": world.traefik.api, "poll_interval": 0.2},
        discovery={"redis_url": world.redis.url, "authorities": [AUTHORITY], "advertise": api, "ttl": 5, "heartbeat": 0.5},
        health={"passive": {"access_log": str(world.access_log), "max_failures": 3, "base_ejection_time": 60},
                "notify_url": coordinator, "sharding": "on"},
        upstream={"ca_file_dirs": [str(world.ca_dir)]},
        leader={"ttl": 3}, writer={"coalesce_window": 0.01, "reconcile_interval": 2},
    )
    started = Daemon(settings)
    await started.start()
    await started.parts.reconciler.wait_synced(30)
    yield started
    await started.stop()


@pytest.fixture
async def service_discovery(world: World) -> AsyncIterator[str]:
    """Prometheus's HTTP SD endpoint over the registrations in Redis: one target per `prometheus_address`."""
    redis = aioredis.Redis.from_url(world.redis.url, decode_responses=True)

    async def handle(request: web.Request) -> web.Response:
        groups = []
        for key in await redis.keys(f"service_discovery.{GROUP}.*"):
            service = {k: json.loads(v) for k, v in (await redis.hgetall(key)).items()}
            # `ingress-delivery-mode` is no Prometheus label name: meta labels, sanitized, for relabelling.
            labels = {f"__meta_backendai_label_{re.sub(r'[^A-Za-z0-9_]', '_', k)}": v for k, v in service["labels"].items()}
            labels["__meta_backendai_service_group"] = service["service_group"]
            groups.append({"targets": [service["endpoint"]["prometheus_address"]], "labels": labels})
        return web.json_response(groups)

    port = free_port()
    runner = await serve_all_paths(port, handle)
    yield f"http://127.0.0.1:{port}/sd"
    await runner.cleanup()
    await redis.aclose()


@pytest.fixture
def prometheus(tmp_path: Path, daemon: Daemon, service_discovery: str) -> Iterator[str]:
    binary = debian_binary("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": f"{EVALUATION:g}s", "evaluation_interval": f"{EVALUATION:g}s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{
            "job_name": JOB, "http_sd_configs": [{"url": service_discovery, "refresh_interval": "1s"}],
            "relabel_configs": [
                {"source_labels": ["__meta_backendai_label_ingress_delivery_mode"], "regex": "api", "action": "keep"},
                {"source_labels": ["__meta_backendai_label_authority"], "target_label": "authority"},
            ],
        }],
    }))
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


class Prom:
    """Prometheus's HTTP API."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url

    async def get(self, path: str, **params: str) -> Any:
        async with self.http.get(f"{self.url}{path}", params=params) as resp:
            body = await resp.json()
        assert body["status"] == "success", body
        return body["data"]

    async def value(self, query: str) -> float | None:
        """The first sample's value of an instant query (None: no sample)."""
        try:
            result = (await self.get("/api/v1/query", query=query))["result"]
        except aiohttp.ClientError:
            return None
        return float(result[0]["value"][1]) if result else None

    async def has(self, query: str, value: float) -> bool:
        return await self.value(query) == value

    async def alerts(self) -> set[str]:
        return {a["labels"]["alertname"] for a in (await self.get("/api/v1/alerts"))["alerts"]}

    async def range(self, query: str, start: float, end: float) -> list[float]:
        """Every finite value any series of `query` had between `start` and `end`, a step a second."""
        data = await self.get("/api/v1/query_range", query=query, start=str(start), end=str(end), step=str(RESOLUTION))
        values = (float(v) for series in data["result"] for _, v in series["values"])
        return [v for v in values if math.isfinite(v)]


def panels() -> list[dict[str, Any]]:
    """Every panel of the dashboard (rows excluded)."""
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def expand(expr: str) -> str:
    """A panel's query as Grafana sends it with every variable at All."""
    return (expr.replace("$job", JOB).replace("$instance", ".+").replace("$root", ".+")
            .replace("$__rate_interval", "5s"))


RESOLUTION = 0.25  # seconds between the evaluations of a range query
EVALUATION = 1.0  # Prometheus's scrape and rule evaluation interval


class Steps:
    """When each scenario step began, to name the step that lit a panel or raised an alert.

    A step begins only once Prometheus has scraped after the previous one ended, and its rules have
    been evaluated since: whatever the previous step caused shows before this one begins.
    """

    def __init__(self, prom: Prom) -> None:
        self.prom = prom
        self.started: list[tuple[float, str]] = []

    async def begin(self, name: str) -> None:
        if self.started:
            ended = time.time()
            scraped = await eventually(lambda: self._scraped_after(ended), timeout=30, interval=0.1)
            await eventually(lambda: holds(time.time() > scraped + EVALUATION + RESOLUTION), interval=0.05)
        self.started.append((time.time(), name))

    async def _scraped_after(self, at: float) -> float | None:
        last = await self.prom.value(f'timestamp(up{{job="{JOB}"}})')
        return last if last is not None and last > at else None

    def at(self, when: float) -> str:
        """The step in progress at `when`."""
        return next((name for began, name in reversed(self.started) if began <= when), "start-up")


async def test_every_panel_returns_data_and_the_scenario_raises_its_alerts_and_no_other(
    daemon: Daemon, prometheus: str, world: World, http: aiohttp.ClientSession, backends: list[Backend], tmp_path: Path,
) -> None:
    prom = Prom(http, prometheus)
    steps = Steps(prom)
    await eventually(lambda: prom.has(f'up{{job="{JOB}"}}', 1), timeout=60, interval=0.5)
    await eventually(lambda: prom.has(f'exporter_ready{{job="{JOB}"}}', 1), timeout=30, interval=0.5)
    start = time.time()
    api = f"http://{daemon.settings.api.listen}/v2/ingress"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    steady, dying, failing, good = [await Backend(n).start() for n in ("steady", "dying", "failing", "good")]
    backends.extend([steady, dying, failing, good])
    failing.status = 502  # /health answers 200: only real requests show it failing

    await steps.begin("pushes")
    ca_file = world.ca_dir / "ca.crt"
    ca_file.write_text(tls_backend_context(tmp_path, "model.internal")[0])
    active, passive, plugin, tls = uid("active"), uid("passive"), uid("plugin"), uid("tls")
    body = {"ingresses": [
        {"authority": AUTHORITY, "id": active, "revision": 1, "hosts": [f"{active}.test"],
         "upstream": {"servers": [{"url": steady.url}, {"url": dying.url}]}, "health_check": FAST},
        {"authority": AUTHORITY, "id": passive, "revision": 1, "hosts": [f"{passive}.test"],
         "upstream": {"servers": [{"url": failing.url}, {"url": good.url}]}, "health_check": FAST},
        # examples/checker-plugin (installed by the test command) checks these servers.
        {"authority": AUTHORITY, "id": plugin, "revision": 1, "hosts": [f"{plugin}.test"],
         "upstream": {"kind": "tcp-connect", "servers": [{"url": steady.url}]}, "health_check": FAST},
        {"authority": AUTHORITY, "id": tls, "revision": 1, "hosts": [f"{tls}.test"],
         "upstream": {"servers": [{"url": "https://127.0.0.1:9"}]},
         "upstream_tls": {"ca_file": str(ca_file), "server_name": "model.internal"}},
    ]}
    async with http.post(f"{api}/upsert?wait=served", json=body, headers=auth) as resp:
        assert resp.status == 204, await resp.text()

    await steps.begin("requests through Traefik to a failing server")
    web_url = world.traefik.url("web")

    async def ejected() -> bool:
        statuses = [(await get_via(http, web_url, f"{passive}.test"))[0] for _ in range(6)]
        return set(statuses) == {200}
    await eventually(ejected, timeout=30)

    await steps.begin("pushes with a wrong token, and a bad push")
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        async with http.post(f"{api}/upsert", json=body, headers={"Authorization": "Bearer wrong"}) as resp:
            assert resp.status == 401
    bad = {"ingresses": [{"authority": AUTHORITY, "id": uid(), "revision": 1, "hosts": ["not a host"]}]}
    async with http.post(f"{api}/upsert", json=bad, headers=auth) as resp:
        assert resp.status == 400, await resp.text()

    await steps.begin("a health-checked server goes down")
    await dying.stop()
    await eventually(lambda: serves(http, web_url, f"{active}.test", body="steady"), timeout=10)
    await eventually(lambda: _notified(world, dying.url), timeout=10)

    async def raised(names: set[str]) -> bool:
        return names <= await prom.alerts()
    await eventually(lambda: raised(set().union(*(a for s, a in RAISED_BY.items() if s != "etcd stopped for a while"))),
                     timeout=60, interval=0.5)

    await steps.begin("etcd stopped for a while")
    # In a thread: the daemon shares this event loop, and a blocked loop would delay its probes.
    await asyncio.to_thread(world.etcd.stop)
    await eventually(lambda: _not_ready(http, f"http://{daemon.settings.control.listen}"), timeout=30)
    refused = {"ingresses": [{"authority": AUTHORITY, "id": uid(), "revision": 1, "hosts": [f"{uid()}.test"],
                              "upstream": {"servers": [{"url": steady.url}]}}]}
    async with http.post(f"{api}/upsert", json=refused, headers=auth) as resp:
        assert resp.status == 503, await resp.text()
    await eventually(lambda: prom.has(f'exporter_leader{{job="{JOB}"}}', 0), timeout=60, interval=0.5)
    await eventually(lambda: raised(RAISED_BY["etcd stopped for a while"]), timeout=60, interval=0.5)
    await asyncio.to_thread(world.etcd.restart)

    await steps.begin("etcd back")
    await eventually(lambda: prom.has(f'exporter_ready{{job="{JOB}"}}', 1), timeout=60, interval=0.5)
    await eventually(lambda: serves(http, web_url, f"{active}.test", body="steady"))
    end = time.time()

    await _every_panel_returned_data(prom, steps, start, end)
    await _the_variables_list_the_daemon(prom, daemon)
    # Every alert Prometheus raised, by the step in progress when it first went pending or firing.
    raised_at = {s["metric"]["alertname"]: steps.at(float(s["values"][0][0])) for s in (await prom.get(
        "/api/v1/query_range", query="count by (alertname) (ALERTS)", start=str(start), end=str(end),
        step=str(RESOLUTION)))["result"]}
    print("\nalert -> the step that raised it:\n" + "\n".join(f"  {a}: {s}" for a, s in sorted(raised_at.items())))
    assert raised_at == {alert: step for step, alerts in RAISED_BY.items() for alert in alerts}


async def _not_ready(http: aiohttp.ClientSession, control: str) -> bool:
    async with http.get(f"{control}/readyz") as resp:
        return resp.status == 503


async def _notified(world: World, url: str) -> bool:
    return any(e["node"] == url and e["to"] == "not_routed" for e in world.notified)


async def _every_panel_returned_data(prom: Prom, steps: Steps, start: float, end: float) -> None:
    """Every query of every panel has data; every panel but MAY_STAY_ZERO showed a value other than 0."""
    lit: dict[str, str] = {}
    for panel in panels():
        values: list[float] = []
        for target in panel["targets"]:
            found = await prom.range(expand(target["expr"]), start, end)
            assert found, (panel["title"], target["expr"])
            values.extend(found)
        first = await _first_nonzero(prom, panel, start, end)
        if first is not None:
            lit[panel["title"]] = steps.at(first)
    print("\npanel -> the step that first lit it:\n" + "\n".join(f"  {t}: {s}" for t, s in lit.items()))
    titles = {p["title"] for p in panels()}
    assert titles - set(lit) <= MAY_STAY_ZERO, titles - set(lit) - MAY_STAY_ZERO


async def _first_nonzero(prom: Prom, panel: dict[str, Any], start: float, end: float) -> float | None:
    """When any query of the panel first had a value other than 0."""
    times = []
    for target in panel["targets"]:
        data = await prom.get("/api/v1/query_range", query=expand(target["expr"]), start=str(start), end=str(end),
                              step=str(RESOLUTION))
        times += [float(t) for series in data["result"] for t, v in series["values"] if math.isfinite(float(v)) and float(v) != 0]
    return min(times, default=None)


async def _the_variables_list_the_daemon(prom: Prom, daemon: Daemon) -> None:
    """The dashboard's job, instance and root variables find this daemon's values."""
    variables = {v["name"]: v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    expected = {"job": JOB, "instance": daemon.settings.control.listen, "root": ROOT}
    for name, value in expected.items():
        query = variables[name]["query"]["query"]  # label_values(<selector>, <label>)
        selector, _, label = query.removeprefix("label_values(").removesuffix(")").rpartition(", ")
        selector = selector.replace("$job", JOB).replace("$instance", ".+")
        values = await prom.get(f"/api/v1/label/{label}/values", **{"match[]": selector})
        assert value in values, (name, query, values)
