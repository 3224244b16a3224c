"""Shared edge objects and the lean layout on a real Traefik: what sharing must not change.

- Two routers naming one rate-limit or in-flight definition each keep a budget of their own
  (Traefik builds a middleware instance per router chain).
- A shared servers transport keeps each service's timeouts and TLS: equal definitions share one
  object, and a different one (another timeout, another server name) is another object.
- Values left to Traefik's defaults are Traefik's defaults: the Host header is passed on, and a
  server written without a weight weighs 1.
- No revision of etcd's history under the root has a router or service naming a missing object
  while ingresses come, change and go (the exporter's write invariant, on the real etcd).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, free_port
from exporter.etcd.client import EtcdClient
from exporter.etcd.types import Op
from tests.conftest import ROOT, Ingresses
from tests.helpers import AUTHORITY, Backend, eventually, record, serve_all_paths, serves, tls_backend_context, uid
from tests.replay import replay

pytestmark = pytest.mark.integration


class Echo:
    """An HTTP backend answering its name and the Host header it received; `/hold` waits for `release`, `/slow` for 3 s."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.release = asyncio.Event()
        self.holding = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Echo:
        async def handle(request: web.Request) -> web.Response:
            if request.path == "/hold":
                self.holding += 1
                await self.release.wait()
            if request.path == "/slow":
                await asyncio.sleep(3)
            return web.Response(text=f"{self.name} {request.headers.get('Host', '')}")

        self._runner = await serve_all_paths(self.port, handle)
        return self

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def echo() -> AsyncIterator[Echo]:
    server = await Echo("echo").start()
    yield server
    await server.stop()


async def status(traefik: EmbeddedTraefik, http: aiohttp.ClientSession, host: str, path: str = "/") -> int:
    async with http.get(f"{traefik.url('web')}{path}", headers={"Host": host}) as resp:
        await resp.read()
        return resp.status


async def named_shared(etcd_client: EtcdClient, ids: list[str]) -> set[str]:
    """The shared objects the routers and services of `ids` name."""
    page = await etcd_client.range_prefix(f"{ROOT}/http/")
    return {kv.value for kv in page.kvs if kv.value.startswith("shared-") and any(f"_{i}/" in kv.key for i in ids)}


async def test_two_routers_naming_one_rate_limit_keep_a_budget_each(
    ingresses: Ingresses, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, echo: Echo, etcd_client: EtcdClient
) -> None:
    one, two = uid(), uid()
    limits = {"rate": {"average": 1, "burst": 1, "period": 60}}
    await ingresses.upsert(record(one, upstream={"servers": [{"url": echo.url}]}, limits=limits),
                           record(two, upstream={"servers": [{"url": echo.url}]}, limits=limits))
    page = await etcd_client.range_prefix(f"{ROOT}/http/routers/")
    named = {kv.value for kv in page.kvs if kv.key.endswith("/middlewares/00") and (one in kv.key or two in kv.key)}
    assert len(named) == 1 and next(iter(named)).startswith("shared-rate-")  # one definition, two routers
    # Both routers came in one transaction: once `one` is served, so is `two`. Polling `one` spends its token.
    await eventually(lambda: _answers(traefik, http, f"{one}.test", 429), timeout=20)
    # `two` still has its own token: a shared budget would answer 429 here.
    assert [await status(traefik, http, f"{two}.test") for _ in range(2)] == [200, 429]


async def _answers(traefik: EmbeddedTraefik, http: aiohttp.ClientSession, host: str, expected: int) -> bool:
    return await status(traefik, http, host) == expected


async def test_two_routers_naming_one_in_flight_limit_keep_a_budget_each(
    ingresses: Ingresses, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, echo: Echo
) -> None:
    one, two = uid(), uid()
    await ingresses.upsert(record(one, upstream={"servers": [{"url": echo.url}]}, limits={"max_in_flight": 1}),
                           record(two, upstream={"servers": [{"url": echo.url}]}, limits={"max_in_flight": 1}))
    await eventually(lambda: _answers(traefik, http, f"{one}.test", 200), timeout=20)
    held = asyncio.create_task(status(traefik, http, f"{one}.test", "/hold"))

    async def holding() -> bool:
        return echo.holding == 1
    await eventually(holding, timeout=10)
    assert await status(traefik, http, f"{one}.test") == 429  # its one slot is taken
    assert await status(traefik, http, f"{two}.test") == 200  # a slot of its own
    echo.release.set()
    assert await held == 200


async def test_a_shared_transport_keeps_each_services_timeouts(
    ingresses: Ingresses, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, echo: Echo
) -> None:
    short_a, short_b, long = uid(), uid(), uid()
    up = {"servers": [{"url": echo.url}]}
    await ingresses.upsert(record(short_a, upstream=up, timeouts={"response_header": 1}),
                           record(short_b, upstream=up, timeouts={"response_header": 1}),
                           record(long, upstream=up, timeouts={"response_header": 6}))
    for iid in (short_a, short_b, long):
        await eventually(lambda: _answers(traefik, http, f"{iid}.test", 200), timeout=20)
    for iid in (short_a, short_b):  # one transport, each service cut at 1 s
        started = time.monotonic()
        assert await status(traefik, http, f"{iid}.test", "/slow") == 504
        assert time.monotonic() - started < 2.5
    assert await status(traefik, http, f"{long}.test", "/slow") == 200  # its own transport: 6 s


async def test_a_shared_transport_keeps_each_services_tls(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    ca_pem, context = tls_backend_context(tmp_path, "model.internal")
    first = await Backend("tls-first", ssl_context=context).start()
    second = await Backend("tls-second", ssl_context=context).start()
    backends.extend([first, second])
    a, b, wrong = uid(), uid(), uid()
    tls = {"ca_pem": ca_pem, "server_name": "model.internal"}
    await ingresses.upsert(record(a, upstream={"servers": [{"url": first.url}]}, upstream_tls=tls),
                           record(b, upstream={"servers": [{"url": second.url}]}, upstream_tls=tls),
                           record(wrong, upstream={"servers": [{"url": second.url}]},
                                  upstream_tls={**tls, "server_name": "other.internal"}))
    web_url = traefik.url("web")
    assert await eventually(lambda: serves(http, web_url, f"{a}.test", body="tls-first"), timeout=20)
    assert await eventually(lambda: serves(http, web_url, f"{b}.test", body="tls-second"))
    # Another server name is another transport: its handshake fails, the shared one's do not.
    assert await eventually(lambda: serves(http, web_url, f"{wrong}.test", status=500))
    assert await serves(http, web_url, f"{a}.test", body="tls-first")


async def test_values_left_to_traefiks_defaults_are_its_defaults(
    ingresses: Ingresses, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, etcd_client: EtcdClient
) -> None:
    light, heavy = await Echo("light").start(), await Echo("heavy").start()
    try:
        iid = uid()
        await ingresses.upsert(record(iid, upstream={"servers": [{"url": light.url}, {"url": heavy.url, "weight": 3}]}))
        page = await etcd_client.range_prefix(f"{ROOT}/http/services/{AUTHORITY}_{iid}/")
        assert sorted(kv.key.rsplit("/", 2)[-2:][1] for kv in page.kvs) == ["url", "url", "weight"]  # no passHostHeader, one weight
        host = f"{iid}.test"
        await eventually(lambda: _answers(traefik, http, host, 200), timeout=20)
        seen = []
        for _ in range(40):
            async with http.get(traefik.url("web"), headers={"Host": host}) as resp:
                seen.append(await resp.text())
        # passHostHeader is true by default: the backend sees the client's Host.
        assert {text.split(" ", 1)[1] for text in seen} == {host}
        # The server without a weight weighs 1 against 3.
        assert 7 <= sum(text.startswith("light") for text in seen) <= 13
    finally:
        await light.stop()
        await heavy.stop()


async def test_no_revision_names_a_missing_shared_object_while_ingresses_come_change_and_go(
    ingresses: Ingresses, etcd: EmbeddedEtcd, etcd_client: EtcdClient, echo: Echo
) -> None:
    start = (await etcd_client.range_prefix(f"{ROOT}/_meta/")).revision
    ids = [uid() for _ in range(6)]
    edge = {"upstream": {"servers": [{"url": echo.url}]}, "allowed_client_ips": ["127.0.0.0/8"], "retry": {"attempts": 2},
            "limits": {"max_in_flight": 8}, "timeouts": {"dial": 3}}
    await ingresses.upsert(*(record(i, **edge) for i in ids))
    first = await named_shared(etcd_client, ids)
    # Half move to other definitions (new objects), then every ingress goes: the objects go with the last.
    await ingresses.upsert(*(record(i, revision=2, **{**edge, "limits": {"max_in_flight": 9}}) for i in ids[:3]))
    every = first | await named_shared(etcd_client, ids)
    assert len(first) == 4 and len(every) == 5  # allow, in-flight (two), retry, transport
    await ingresses.remove(*((AUTHORITY, i) for i in ids[:3]))
    await ingresses.remove(*((AUTHORITY, i) for i in ids[3:]))

    async def gone() -> bool:
        page = await etcd_client.range_prefix(f"{ROOT}/http/")
        return not {part for kv in page.kvs for part in kv.key.split("/")} & every
    await eventually(gone, timeout=20)
    violations, checked = await replay(etcd.url, ROOT, start)
    assert checked > 0 and violations == []


async def test_a_shared_object_someone_else_deletes_or_edits_is_repaired(
    ingresses: Ingresses, etcd_client: EtcdClient, echo: Echo
) -> None:
    iid = uid()
    await ingresses.upsert(record(iid, upstream={"servers": [{"url": echo.url}]}, limits={"max_in_flight": 7654}))
    (name,) = await named_shared(etcd_client, [iid])
    amount = f"{ROOT}/http/middlewares/{name}/inFlightReq/amount"
    for damage in (None, "1"):  # deleted, then edited
        await etcd_client.txn([], [Op(amount, damage)])

        async def repaired() -> bool:
            found = await etcd_client.get(amount)
            return found is not None and found.value == "7654"
        await eventually(repaired, timeout=20)


def _written_before(iid: str, url: str) -> dict[str, str]:
    """What the layout before wrote for an ingress with an allowlist, an in-flight limit and a dial timeout."""
    name = f"{AUTHORITY}_{iid}"
    router, svc = f"{ROOT}/http/routers/{name}", f"{ROOT}/http/services/{name}/loadBalancer"
    return {
        f"{router}/rule": f"Host(`{iid}.test`)", f"{router}/service": name, f"{router}/entryPoints/00": "web",
        f"{router}/priority": "101", f"{router}/middlewares/00": f"{name}_allow", f"{router}/middlewares/01": f"{name}_inflight",
        f"{ROOT}/http/middlewares/{name}_allow/ipAllowList/sourceRange/00": "127.0.0.0/8",
        f"{ROOT}/http/middlewares/{name}_inflight/inFlightReq/amount": "16",
        f"{ROOT}/http/serversTransports/{name}_transport/forwardingTimeouts/dialTimeout": "3s",
        f"{svc}/servers/000/url": url, f"{svc}/servers/000/weight": "1", f"{svc}/passHostHeader": "true",
        f"{svc}/serversTransport": f"{name}_transport",
    }


async def test_ingresses_written_in_the_layout_before_move_to_shared_objects_while_served(
    ingresses: Ingresses, etcd: EmbeddedEtcd, etcd_client: EtcdClient, traefik: EmbeddedTraefik, http: aiohttp.ClientSession,
    echo: Echo,
) -> None:
    ids = [uid() for _ in range(3)]
    edge = {"allowed_client_ips": ["127.0.0.0/8"], "limits": {"max_in_flight": 16}, "timeouts": {"dial": 3}}
    start = (await etcd_client.range_prefix(f"{ROOT}/_meta/")).revision
    for iid in ids:  # as an exporter of the version before left them: keys and record in one transaction
        rec = record(iid, upstream={"servers": [{"url": echo.url}]}, **edge)
        ingresses.owned[rec.key] = rec.revision
        await etcd_client.txn([], [*(Op(k, v) for k, v in _written_before(iid, echo.url).items()),
                                   Op(f"traefik-etcd-exporter/records/{AUTHORITY}/{iid}", rec.value)])

    async def moved() -> bool:
        page = await etcd_client.range_prefix(f"{ROOT}/http/")
        keys = [kv.key for kv in page.kvs if any(f"_{i}" in kv.key for i in ids)]
        return bool(keys) and not any(k.endswith(("/weight", "/passHostHeader")) or "_inflight/" in k for k in keys)
    await eventually(moved, timeout=30)
    assert len(await named_shared(etcd_client, ids)) == 3  # allow, in-flight, transport: one each for the three
    for iid in ids:
        assert await eventually(lambda: serves(http, traefik.url("web"), f"{iid}.test", body=f"echo {iid}.test"), timeout=20)
    violations, checked = await replay(etcd.url, ROOT, start)
    assert checked > 0 and violations == []
