"""Shared pieces of the benchmarks: a fresh etcd per measurement, ingress generators, raw writers."""

from __future__ import annotations

import asyncio
import base64
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from bench.harness import HEADERS, cpu_seconds
from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, start_etcd
from exporter.ingress import Ingress
from exporter.keys import KeyLayout
from exporter.plan.planner import Planner
from exporter.render.renderer import Renderer
from exporter.render.root_keys import generate_certificate
from exporter.store.observed import Observed
from exporter.store.records import Record

ROOT_KEY = "traefik/worker_{authority}"
RECORDS = "traefik-etcd-exporter/records"


@contextmanager
def fresh_etcd() -> Iterator[EmbeddedEtcd]:
    """A new etcd (empty history) on free loopback ports, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench-etcd-") as tmp:
        etcd = start_etcd(Path(tmp))
        try:
            yield etcd
        finally:
            etcd.stop()


# Every model-serving edge field, with the settings a fleet would give all its ingresses alike.
EDGE_FIELDS: dict[str, Any] = {
    "profile": "openai",
    "timeouts": {"dial": 5, "response_header": 60, "idle": 90},
    "keepalive": False,
    "limits": {"max_body_bytes": 1048576, "max_in_flight": 32, "rate": {"average": 50, "burst": 100, "period": 1}},
    "retry": {"attempts": 2, "initial_interval": 0.1},
    "allowed_client_ips": ["10.0.0.0/8"],
}
# Workloads: typical ingresses, every edge field equal, every edge field with an allowlist of each ingress's own.
EDGES = ("", "equal", "distinct")


def ingress_body(i: int, authority: str = "bench", revision: int = 1, port: int = 8000, edge: str = "") -> dict[str, Any]:
    """Ingress `i` of a workload: one host, two servers, and the edge fields `edge` names (EDGES)."""
    body: dict[str, Any] = {
        "authority": authority,
        "id": f"i{i}",
        "revision": revision,
        "hosts": [f"i{i}.example.test"],
        "upstream": {"servers": [{"url": f"http://10.0.{i // 250 % 250}.{i % 250}:{port}"},
                                 {"url": f"http://10.1.{i // 250 % 250}.{i % 250}:{port}"}]},
    }
    if edge:
        body.update(EDGE_FIELDS)
    if edge == "distinct":
        body["allowed_client_ips"] = [f"10.{i // 250 % 250}.{i % 250}.0/24", f"172.16.{i // 62500 % 250}.0/24"]
    return body


def make_records(n: int, authority: str = "bench", revision: int = 1, port: int = 8000, edge: str = "") -> list[Record]:
    """`n` ingresses of a workload (`ingress_body`)."""
    return [Record.of(Ingress.model_validate(ingress_body(i, authority, revision, port, edge))) for i in range(n)]


def exporter_keys(records: list[Record]) -> list[tuple[str, str]]:
    """Exactly the keys and values the exporter writes for `records` into an empty etcd."""
    layout = KeyLayout(ROOT_KEY, RECORDS)
    planner = Planner(Renderer(layout, ["web"]), layout, generate_certificate())
    plan = planner.plan({r.key: r for r in records}, Observed(layout))
    return [(c.key, c.new or "") for c in plan.changes()]


def ingress_keys(records: list[Record]) -> list[list[tuple[str, str]]]:
    """Per record, the keys and values of that ingress alone (its objects and its record, no root keys)."""
    layout = KeyLayout(ROOT_KEY, RECORDS)
    planner = Planner(Renderer(layout, ["web"]), layout, generate_certificate())
    plan = planner.plan({r.key: r for r in records}, Observed(layout), [r.key for r in records], include_roots=False)
    by_owner = {u.owner: [(c.key, c.new or "") for c in u.changes] for u in plan.units}
    return [by_owner[r.key] for r in records]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def raw_write(url: str, kvs: list[tuple[str, str]], in_flight: int, ops: int = 128) -> float:
    """Seconds to put `kvs` with bare `ops`-put transactions, `in_flight` at once (no compares)."""
    bodies = [
        {"success": [{"request_put": {"key": _b64(k), "value": _b64(v)}} for k, v in kvs[i : i + ops]]}
        for i in range(0, len(kvs), ops)
    ]
    sem = asyncio.Semaphore(in_flight)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:

        async def one(body: dict[str, Any]) -> None:
            async with sem, session.post(f"{url}/v3/kv/txn", json=body) as resp:
                resp.raise_for_status()
                await resp.read()

        started = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - started


@asynccontextmanager
async def watching(url: str, prefixes: list[str]) -> AsyncIterator[None]:
    """Watch streams on `prefixes` read (not decoded) while the body runs, as the exporter's mirror watches."""
    async with aiohttp.ClientSession() as session:

        async def read(prefix: str) -> None:
            end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
            body = {"create_request": {"key": _b64(prefix), "range_end": _b64(end)}}
            async with session.post(f"{url}/v3/watch", json=body, timeout=aiohttp.ClientTimeout(total=None)) as resp:
                async for _line in resp.content:
                    pass

        readers = [asyncio.create_task(read(p)) for p in prefixes]
        try:
            yield
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


async def txn_round_trip(url: str, samples: int = 50) -> list[float]:
    """Latencies of single one-put txns (the floor of any commit)."""
    out = []
    async with aiohttp.ClientSession() as session:
        for i in range(samples):
            body = {"success": [{"request_put": {"key": _b64(f"bench-rtt/{i}"), "value": _b64("x")}}]}
            started = time.perf_counter()
            async with session.post(f"{url}/v3/kv/txn", json=body) as resp:
                await resp.read()
            out.append(time.perf_counter() - started)
    return out


def body(records: list[Record]) -> bytes:
    """An upsert request body of `records`."""
    return ('{"ingresses":[' + ",".join(r.content for r in records) + "]}").encode()


async def put_in_place(session: aiohttp.ClientSession, base: str, n: int) -> None:
    """`n` ingresses pushed 1,000 per request (the request bound)."""
    records = make_records(n)
    for i in range(0, n, 1000):
        await upsert(session, base, records[i : i + 1000])


async def upsert(session: aiohttp.ClientSession, base: str, records: list[Record], query: str = "") -> None:
    """One upsert request; raises unless it is answered 204."""
    async with session.post(f"{base}/v2/ingress/upsert{query}", data=body(records), headers=HEADERS) as resp:
        if resp.status != 204:
            raise RuntimeError(f"upsert answered {resp.status}: {await resp.text()}")


IDLE_CPU = 0.05  # CPU seconds per half second below which Traefik counts as idle


async def _listed(traefik: EmbeddedTraefik, router: str) -> bool:
    async with aiohttp.ClientSession() as session, session.get(f"{traefik.api}/api/http/routers/{router}") as resp:
        return resp.status == 200


async def until_listed(traefik: EmbeddedTraefik, router: str, timeout: float = 600) -> float:
    """Until Traefik lists `router` (it applies a configuration whole: the others with it); seconds taken."""
    started = time.monotonic()
    while not await _listed(traefik, router):
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"Traefik did not list {router} in {timeout}s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def until_idle(traefik: EmbeddedTraefik, timeout: float = 900) -> float:
    """Until Traefik spends less than IDLE_CPU per half second; the CPU seconds it spent meanwhile."""
    started, spent = time.monotonic(), 0.0
    while time.monotonic() - started < timeout:
        before = cpu_seconds(traefik.proc.pid)
        await asyncio.sleep(0.5)
        burst = cpu_seconds(traefik.proc.pid) - before
        spent += burst
        if burst < IDLE_CPU:
            return spent
    raise RuntimeError("Traefik did not go idle")
