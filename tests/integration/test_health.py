"""Health checking on real backends, a real etcd and a real Traefik."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.daemon import Daemon
from exporter.embedded import EmbeddedTraefik
from exporter.etcd.client import EtcdClient
from tests.conftest import API_TOKEN, ROOT
from tests.helpers import AUTHORITY, Backend, eventually, get_via, uid

pytestmark = pytest.mark.integration
FAST = {"enable": True, "interval": 0.2, "max_retries": 2, "max_wait_time": 0.5, "initial_delay": 0}


async def push(http: aiohttp.ClientSession, daemon: Daemon, *ingresses: dict[str, Any], path: str = "upsert") -> None:
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    async with http.post(f"http://{daemon.settings.api.listen}/v2/ingress/{path}", json={"ingresses": list(ingresses)},
                         headers=headers) as resp:
        assert resp.status == 204, await resp.text()


def ing(iid: str, upstream: dict[str, Any], health: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    body = {"authority": AUTHORITY, "id": iid, "revision": 1, "hosts": [f"{iid}.test"], "upstream": upstream}
    if health is not None:
        body["health_check"] = health
    body.update(extra)
    return body


@pytest.fixture
async def cleanup(api_daemon: Daemon, http: aiohttp.ClientSession) -> Any:
    pushed: list[tuple[str, int]] = []
    yield pushed
    if pushed:
        await push(http, api_daemon, *({"authority": AUTHORITY, "id": i, "revision": r} for i, r in pushed), path="remove")


async def answers(http: aiohttp.ClientSession, traefik: Any, host: str, n: int = 20) -> Counter[str]:
    out: Counter[str] = Counter()
    for _ in range(n):
        status, text = await get_via(http, traefik.url("web"), host, "/work")
        out[text if status == 200 else str(status)] += 1
    return out


async def urls_in_etcd(client: EtcdClient, iid: str) -> set[str]:
    kvs = (await client.range_prefix(f"{ROOT}/http/services/{AUTHORITY}_{iid}")).kvs
    return {kv.value for kv in kvs if kv.key.endswith("/url")}


async def test_a_dead_backend_is_ejected_in_bounds_and_comes_back(
    api_daemon: Daemon, cleanup: Any, backends: list[Backend], etcd_client: EtcdClient, traefik: EmbeddedTraefik,
    http: aiohttp.ClientSession,
) -> None:
    a, b = await Backend("a").start(), await Backend("b").start()
    backends.extend([a, b])
    iid = uid()
    await push(http, api_daemon, ing(iid, {"servers": [{"url": a.url}, {"url": b.url}]}, FAST))
    cleanup.append((iid, 1))
    await eventually(lambda: _eq(urls_in_etcd(etcd_client, iid), {a.url, b.url}))
    await eventually(lambda: _both(answers(http, traefik, f"{iid}.test")))

    await b.stop()
    died = time.monotonic()
    await eventually(lambda: _eq(urls_in_etcd(etcd_client, iid), {a.url}), interval=0.01)
    ejected_after = time.monotonic() - died
    # interval x max_retries plus a writer window; the rest is slack for a loaded 2-core machine
    # (one probe timeout, jitter, Traefik-independent: this is etcd's view).
    assert ejected_after <= 0.2 * 2 + 0.02 + 0.5 + 0.6, ejected_after
    await eventually(lambda: _only(answers(http, traefik, f"{iid}.test"), "a"))

    await b.start()
    await eventually(lambda: _eq(urls_in_etcd(etcd_client, iid), {a.url, b.url}))
    await eventually(lambda: _both(answers(http, traefik, f"{iid}.test")))


async def test_initial_delay_grace_no_ejection_and_no_traffic_before_first_success(
    api_daemon: Daemon, cleanup: Any, backends: list[Backend], etcd_client: EtcdClient, traefik: EmbeddedTraefik,
    http: aiohttp.ClientSession,
) -> None:
    good, late = await Backend("good").start(), await Backend("late").start()
    late.health = 503
    backends.extend([good, late])
    iid = uid()
    health = {**FAST, "initial_delay": 30}
    await push(http, api_daemon, ing(iid, {"servers": [{"url": good.url}, {"url": late.url}]}, health))
    cleanup.append((iid, 1))
    await eventually(lambda: _only(answers(http, traefik, f"{iid}.test"), "good"))
    # Several failed probes later: counted, still not ejected (grace), and no traffic yet.
    await eventually(lambda: _failures_at_least(http, api_daemon, iid, late.port, 4))
    node = await _node(http, api_daemon, iid, late.port)
    assert node["status"] != "unhealthy"
    assert late.hits["/work"] == 0
    late.health = 200
    await eventually(lambda: _both(answers(http, traefik, f"{iid}.test"), "good", "late"))


async def test_a_dead_canary_gets_no_traffic_and_a_dead_primary_neither(
    api_daemon: Daemon, cleanup: Any, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    primary, canary = await Backend("p").start(), await Backend("c").start()
    backends.extend([primary, canary])
    iid = uid()
    body = ing(iid, {"servers": [{"url": primary.url}]}, FAST,
               canary={"weight": 50, "upstream": {"servers": [{"url": canary.url}]}})
    await push(http, api_daemon, body)
    cleanup.append((iid, 1))
    host = f"{iid}.test"
    await eventually(lambda: _both(answers(http, traefik, host), "p", "c"))
    # Every canary server down: its half goes to the primary, not to 503s.
    await canary.stop()
    await eventually(lambda: _only(answers(http, traefik, host, 40), "p"))
    await canary.start()
    await eventually(lambda: _both(answers(http, traefik, host), "p", "c"))
    # And the other way round.
    await primary.stop()
    await eventually(lambda: _only(answers(http, traefik, host, 40), "c"))


async def test_all_servers_down_answers_503_not_404(
    api_daemon: Daemon, cleanup: Any, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    only = await Backend("only").start()
    backends.append(only)
    iid = uid()
    await push(http, api_daemon, ing(iid, {"servers": [{"url": only.url}]}, FAST))
    cleanup.append((iid, 1))
    await eventually(lambda: _only(answers(http, traefik, f"{iid}.test", 3), "only"))
    await only.stop()
    await eventually(lambda: _only(answers(http, traefik, f"{iid}.test", 3), "503"))
    router = await _json(http, f"{traefik.api}/api/http/routers/{AUTHORITY}_{iid}@etcd")
    assert router["status"] == "enabled"


async def test_ai_proxy_multi_one_instance_down_shifts_its_share(
    api_daemon: Daemon, cleanup: Any, backends: list[Backend], etcd_client: EtcdClient, traefik: EmbeddedTraefik,
    http: aiohttp.ClientSession,
) -> None:
    x, y = await Backend("x").start(), await Backend("y").start()
    backends.extend([x, y])
    iid = uid()
    upstream = {
        "kind": "ai-proxy-multi",
        "instances": [
            {"name": "x", "url": x.url, "weight": 1, "checks": {"path": "/health", "interval": 0.2, "max_retries": 2,
                                                                "max_wait_time": 0.5}},
            {"name": "y", "url": y.url, "weight": 1},
        ],
    }
    await push(http, api_daemon, ing(iid, upstream, {**FAST}))
    cleanup.append((iid, 1))
    await eventually(lambda: _both(answers(http, traefik, f"{iid}.test"), "x", "y"))
    entries = await _json(http, f"http://{api_daemon.settings.control.listen}/v1/healthcheck/{AUTHORITY}/{iid}/checkers")
    assert [(e["name"], e["plugin"], e["meta"]) for e in entries] == [
        (f"{AUTHORITY}/{iid}/primary/x", "ai-proxy-multi", {"instance": "x"}),
        (f"{AUTHORITY}/{iid}/primary/y", "ai-proxy-multi", {"instance": "y"}),
    ]
    await x.stop()
    await eventually(lambda: _only(answers(http, traefik, f"{iid}.test"), "y"))
    entries = await _json(http, f"http://{api_daemon.settings.control.listen}/v1/healthcheck/{AUTHORITY}/{iid}/checkers")
    assert entries[0]["nodes"][0]["status"] == "unhealthy" and entries[1]["nodes"][0]["status"] == "healthy"


async def test_control_api_shapes_codes_html_and_metrics(
    api_daemon: Daemon, cleanup: Any, backends: list[Backend], http: aiohttp.ClientSession
) -> None:
    control = f"http://{api_daemon.settings.control.listen}"
    plain = uid()
    await push(http, api_daemon, ing(plain, {"servers": [{"url": "http://127.0.0.1:9"}]}))
    cleanup.append((plain, 1))
    async with http.get(f"{control}/v1/healthcheck/{AUTHORITY}/{plain}/checkers") as resp:
        assert resp.status == 200 and await resp.text() == "[]"
    async with http.get(f"{control}/v1/healthcheck/{AUTHORITY}/nope-{plain}/checkers") as resp:
        assert resp.status == 404
    async with http.get(f"{control}/v1/healthcheck/{AUTHORITY}/{plain}/targets") as resp:
        assert resp.status == 400
    all_entries = await _json(http, f"{control}/v1/healthcheck")
    assert isinstance(all_entries, list)
    backends.append(await Backend("h").start())
    checked = uid()
    await push(http, api_daemon, ing(checked, {"servers": [{"url": backends[0].url}]}, FAST))
    cleanup.append((checked, 1))
    await eventually(lambda: _node_status(http, api_daemon, checked, backends[0].port, "healthy"))
    entry = (await _json(http, f"{control}/v1/healthcheck/{AUTHORITY}/{checked}/checkers"))[0]
    assert set(entry) == {"name", "type", "nodes"} and entry["type"] == "http"
    node = entry["nodes"][0]
    assert set(node) == {"ip", "port", "hostname", "status", "counter"}
    assert set(node["counter"]) == {"success", "http_failure", "tcp_failure", "timeout_failure"}
    async with http.get(f"{control}/v1/healthcheck", headers={"Accept": "text/html"}) as resp:
        assert resp.content_type == "text/html"
        page = await resp.text()
        assert f"{AUTHORITY}/{checked}/primary" in page and "<table" in page
    async with http.get(f"{control}/metrics") as resp:
        families = {f.name: f for f in text_string_to_metric_families(await resp.text())}
    for name in ("exporter_health_probes", "exporter_health_transitions", "exporter_health_nodes", "exporter_etcd_txns",
                 "exporter_etcd_keys_written", "exporter_plan_changes", "exporter_reconcile_seconds", "exporter_etcd_errors",
                 "exporter_api_requests"):
        assert name in families, sorted(families)
    probes = {s.labels["result"]: s.value for s in families["exporter_health_probes"].samples if s.name.endswith("_total")}
    assert probes.get("success", 0) >= 1
    async with http.get(f"{control}/healthz") as resp:
        assert resp.status == 200
    async with http.get(f"{control}/readyz") as resp:
        assert resp.status == 200 and (await resp.json())["reasons"] == []


async def _eq(coro: Any, expected: Any) -> bool:
    return bool(await coro == expected)


async def _both(coro: Any, first: str = "a", second: str = "b") -> bool:
    seen = await coro
    return bool(seen[first] > 0 and seen[second] > 0)


async def _only(coro: Any, name: str) -> bool:
    seen = await coro
    return set(seen) == {name}


async def _json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _node(http: aiohttp.ClientSession, daemon: Daemon, iid: str, port: int) -> dict[str, Any]:
    entries = await _json(http, f"http://{daemon.settings.control.listen}/v1/healthcheck/{AUTHORITY}/{iid}/checkers")
    return next(n for e in entries for n in e["nodes"] if n["port"] == port)


async def _failures_at_least(http: aiohttp.ClientSession, daemon: Daemon, iid: str, port: int, n: int) -> bool:
    return bool((await _node(http, daemon, iid, port))["counter"]["http_failure"] >= n)


async def _node_status(http: aiohttp.ClientSession, daemon: Daemon, iid: str, port: int, status: str) -> bool:
    return bool((await _node(http, daemon, iid, port))["status"] == status)


async def test_a_third_party_plugin_from_its_entry_point_declares_checkers(
    api_daemon: Daemon, cleanup: Any, backends: list[Backend], etcd_client: EtcdClient, traefik: EmbeddedTraefik,
    http: aiohttp.ClientSession,
) -> None:
    # examples/checker-plugin is installed by the test command; its kind is `tcp-connect`.
    assert "tcp-connect" in api_daemon.parts.health.kinds
    up, down = await Backend("up").start(), Backend("down")
    backends.append(up)
    iid = uid()
    upstream = {"kind": "tcp-connect", "servers": [{"url": up.url}, {"url": down.url}], "config": {"team": "search"}}
    await push(http, api_daemon, ing(iid, upstream, FAST))
    cleanup.append((iid, 1))
    control = f"http://{api_daemon.settings.control.listen}"
    entries = await eventually(lambda: _entries_with(http, f"{control}/v1/healthcheck", iid, 2))
    assert [(e["plugin"], e["meta"], e["type"]) for e in entries] == [
        ("tcp-connect", {"team": "search", "server": 0}, "tcp"),
        ("tcp-connect", {"team": "search", "server": 1}, "tcp"),
    ]
    await eventually(lambda: _eq(urls_in_etcd(etcd_client, iid), {up.url}))
    await eventually(lambda: _only(answers(http, traefik, f"{iid}.test"), "up"))


async def test_an_unknown_upstream_kind_is_refused_with_400(api_daemon: Daemon, http: aiohttp.ClientSession) -> None:
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    body = {"ingresses": [ing(uid(), {"kind": "no-such-kind", "servers": [{"url": "http://127.0.0.1:9"}]})]}
    async with http.post(f"http://{api_daemon.settings.api.listen}/v2/ingress/upsert", json=body, headers=headers) as resp:
        assert resp.status == 400
        answer = await resp.json()
    assert answer["type"] == "ValidationFailed" and "no-such-kind" in answer["title"]


async def _entries_with(http: aiohttp.ClientSession, url: str, iid: str, n: int) -> list[dict[str, Any]] | None:
    entries = [e for e in await _json(http, url) if e["name"].startswith(f"{AUTHORITY}/{iid}/")]
    return entries if len(entries) == n else None
