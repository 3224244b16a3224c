"""What the exporter says equals what Traefik serves: the observer, `?wait=served`, readiness (real etcd and Traefik)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from exporter.daemon import Daemon
from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, free_port, start_etcd, start_traefik
from exporter.etcd.client import EtcdClient
from exporter.etcd.types import Compare, Op, TxnResult
from exporter.keys import IngressRef
from exporter.render.renderer import BUILTIN_TEMPLATES
from exporter.traefik.api import TraefikApi
from tests.conftest import API_TOKEN, ROOT, settings_for
from tests.helpers import AUTHORITY, Backend, eventually, serves, uid

pytestmark = pytest.mark.integration
MAX_LAG = 2.0
SERVED_TIMEOUT = 3.0


def _settings(etcd_url: str, traefik_api: str, **overrides: Any) -> dict[str, Any]:
    return {
        "records_prefix": f"{uid('conv')}/records",
        "api": {"listen": f"127.0.0.1:{free_port()}", "token": API_TOKEN, "served_timeout": SERVED_TIMEOUT},
        "control": {"listen": f"127.0.0.1:{free_port()}"},
        "traefik": {"api_url": traefik_api, "max_lag": MAX_LAG, "poll_interval": 0.2},
        **overrides,
    }


@pytest.fixture(scope="module")
async def daemon(etcd: EmbeddedEtcd, traefik: EmbeddedTraefik) -> AsyncIterator[Daemon]:
    """A daemon next to the session Traefik, observing it."""
    running = Daemon(settings_for(etcd.url, **_settings(etcd.url, traefik.api)))
    await running.start()
    await running.parts.reconciler.wait_synced(30)
    yield running
    await running.stop()


class Client:
    def __init__(self, daemon: Daemon, http: aiohttp.ClientSession, authority: str = AUTHORITY) -> None:
        self.authority = authority
        self.api = f"http://{daemon.settings.api.listen}"
        self.control = f"http://{daemon.settings.control.listen}"
        self.http = http
        self.pushed: dict[str, int] = {}

    async def push(self, path: str, *ingresses: dict[str, Any], wait: bool = False) -> tuple[int, Any]:
        query = "?wait=served" if wait else ""
        headers = {"Authorization": f"Bearer {API_TOKEN}"}
        async with self.http.post(f"{self.api}/v2/ingress/{path}{query}", json={"ingresses": list(ingresses)}, headers=headers) as resp:
            text = await resp.text()
            return resp.status, (await resp.json()) if text else None

    async def upsert(self, iid: str, url: str, revision: int = 1, wait: bool = False) -> tuple[int, Any]:
        body = {"authority": self.authority, "id": iid, "revision": revision, "hosts": [f"{iid}.test"],
                "upstream": {"servers": [{"url": url}]}}
        self.pushed[iid] = revision
        return await self.push("upsert", body, wait=wait)

    async def remove(self, iid: str, wait: bool = False) -> tuple[int, Any]:
        revision = self.pushed.pop(iid)
        return await self.push("remove", {"authority": self.authority, "id": iid, "revision": revision}, wait=wait)

    async def convergence(self) -> dict[str, Any]:
        async with self.http.get(f"{self.control}/v1/convergence") as resp:
            assert resp.status == 200
            data: dict[str, Any] = await resp.json()
            return data

    async def root(self) -> dict[str, Any]:
        roots = (await self.convergence())["roots"]
        assert [r["root"] for r in roots] == [ROOT], roots
        root: dict[str, Any] = roots[0]
        return root

    async def readyz(self) -> tuple[int, list[str]]:
        async with self.http.get(f"{self.control}/readyz") as resp:
            return resp.status, (await resp.json())["reasons"]

    async def metric(self, name: str, labels: str = f'{{root="{ROOT}"}}') -> float | None:
        async with self.http.get(f"{self.control}/metrics") as resp:
            for line in (await resp.text()).splitlines():
                if line.startswith(f"{name}{labels} "):
                    return float(line.rsplit(" ", 1)[1])
        return None


@pytest.fixture
async def client(daemon: Daemon, http: aiohttp.ClientSession) -> AsyncIterator[Client]:
    c = Client(daemon, http)
    yield c
    for iid in list(c.pushed):
        await c.remove(iid)


async def _converged(client: Client) -> bool:
    root = await client.root()
    return bool(root["state"] == "converged" and root["applied_revision"] == root["committed_revision"] > 0)


async def test_converged_after_pushes_with_exact_revisions_status_and_metrics(
    client: Client, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, backends: list[Backend]
) -> None:
    backend = await Backend("conv").start()
    backends.append(backend)
    iid = uid()
    assert (await client.upsert(iid, backend.url))[0] == 204
    await eventually(lambda: _converged(client))
    root = await client.root()
    assert root["blocking_keys"] == [] and root["router_errors"] == [] and root["lag_seconds"] == 0
    assert await serves(http, traefik.url("web"), f"{iid}.test", body="conv")
    async with http.get(f"{client.api}/v2/ingress?authority={AUTHORITY}", headers={"Authorization": f"Bearer {API_TOKEN}"}) as resp:
        entry = next(i for i in (await resp.json())["ingresses"] if i["id"] == iid)
    assert entry["status"]["served"] is True and entry["status"]["errors"] == []
    assert 0 < entry["status"]["committed_revision"] <= root["committed_revision"]
    assert await client.metric("exporter_traefik_converged") == 1
    assert await client.metric("exporter_traefik_applied_revision") == root["applied_revision"]
    assert await client.readyz() == (200, [])


async def test_roots_that_are_string_prefixes_of_each_other_are_named(client: Client, http: aiohttp.ClientSession) -> None:
    one, ten = uid("p"), uid("p")
    up = {"servers": [{"url": "http://127.0.0.1:9"}]}
    # Authorities `<x>` and `<x>0`: roots traefik/worker_<x> and traefik/worker_<x>0.
    bodies = [{"authority": authority, "id": iid, "revision": 1, "hosts": [f"{iid}.test"], "upstream": up}
              for authority, iid in ((one, one), (f"{one}0", ten))]
    assert (await client.push("upsert", *bodies))[0] == 204
    try:
        overlaps = (await client.convergence())["overlapping_roots"]
        assert {"root": f"traefik/worker_{one}", "prefix_of": f"traefik/worker_{one}0"} in overlaps
    finally:
        removals = [{"authority": b["authority"], "id": b["id"], "revision": 1} for b in bodies]
        assert (await client.push("remove", *removals))[0] == 204
    assert not any(o["root"] == f"traefik/worker_{one}" for o in (await client.convergence())["overlapping_roots"])


async def test_wait_served_answers_once_traefik_serves_and_removal_once_it_no_longer_does(
    client: Client, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, backends: list[Backend]
) -> None:
    backend = await Backend("waited").start()
    backends.append(backend)
    for _ in range(3):
        iid = uid()
        assert (await client.upsert(iid, backend.url, wait=True))[0] == 204
        # No polling: the very next request is served.
        assert await serves(http, traefik.url("web"), f"{iid}.test", body="waited")
        assert (await client.remove(iid, wait=True))[0] == 204
        assert await serves(http, traefik.url("web"), f"{iid}.test", status=404)
    # How long Traefik took to apply each commit: measured from what the observer saw.
    applies = (await client.root())["apply_seconds"]
    assert applies is not None and 0 < applies["median"] < SERVED_TIMEOUT and 0 < applies["last"] < SERVED_TIMEOUT
    assert (await client.metric("exporter_traefik_apply_seconds_count") or 0) >= 5


async def test_wait_served_waits_for_the_last_part_of_a_split_ingress(
    etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, backends: list[Backend],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 40 servers (39 of weight 0) are more keys than 16 operations: the ingress is written as several transactions,
    # its record in the first, its router in the last. Each part is held until Traefik applied
    # the one before, so Traefik has served the record's revision long before the last part.
    backend = await Backend("split").start()
    backends.append(backend)
    running = Daemon(settings_for(etcd.url, **_settings(etcd.url, traefik.api), etcd={"endpoints": [etcd.url], "max_txn_ops": 16}))
    iid = uid()
    parts: list[int] = []
    beacons: list[str | None] = []
    send = running.parts.etcd.txn
    shown = TraefikApi(traefik.api)

    async def paced(compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        ours = any(f"_{iid}" in op.key for op in ops)
        if ours and beacons:
            await eventually(lambda: _shows(shown, beacons[-1]), timeout=20)
        reply = await send(compares, ops)
        if ours and reply.succeeded:
            parts.append(reply.revision)
            beacons.append(next(op.value for op in ops if op.key == running.settings.layout().beacon_key(ROOT)))
        return reply

    monkeypatch.setattr(running.parts.etcd, "txn", paced)
    await running.start()
    client = Client(running, http)
    try:
        await running.parts.reconciler.wait_synced(30)
        servers = [{"url": backend.url}, *({"url": f"http://127.0.0.1:{10_000 + n}", "weight": 0} for n in range(39))]
        body = {"authority": AUTHORITY, "id": iid, "revision": 1, "hosts": [f"{iid}.test"], "upstream": {"servers": servers}}
        client.pushed[iid] = 1
        assert (await client.push("upsert", body, wait=True))[0] == 204
        assert len(parts) >= 3
        assert running.parts.reconciler.ledger.revision_of(IngressRef(AUTHORITY, iid)) == parts[-1]
        # Answered only once Traefik applied the last part: the router is there at once.
        assert running.parts.observer is not None and running.parts.observer.served(ROOT, parts[-1])
        assert await serves(http, traefik.url("web"), f"{iid}.test", body="split")
    finally:
        for ref in list(client.pushed):
            await client.remove(ref)
        await running.stop()
        await shown.close()


async def _shows(api: TraefikApi, beacon: str | None) -> bool:
    return await api.beacon() == beacon


async def test_a_foreign_undecodable_key_freezes_traefik_is_named_and_clearing_it_converges(
    client: Client, etcd_client: EtcdClient, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, backends: list[Backend]
) -> None:
    backend = await Backend("blocked").start()
    backends.append(backend)
    before = uid()
    assert (await client.upsert(before, backend.url, wait=True))[0] == 204
    bad = f"{ROOT}/http/routers/foreign-{uid()}/priority"
    await etcd_client.put(bad, "abc")
    try:
        iid = uid()
        started = time.monotonic()
        status, body = await client.upsert(iid, backend.url, wait=True)
        assert status == 504 and body["type"] == "NotServedInTime", body
        assert body["data"]["committed_revision"] > body["data"]["applied_revision"] > 0
        assert body["data"]["state"] in ("pending", "frozen")
        assert time.monotonic() - started >= SERVED_TIMEOUT
        root = await eventually(lambda: _state_is(client, "frozen"), timeout=MAX_LAG + 5)
        assert root["blocking_keys"] == [bad] and root["lag_seconds"] > MAX_LAG
        status_code, reasons = await client.readyz()
        assert status_code == 503 and f"traefik frozen on {ROOT}: blocked by key {bad}" in reasons
        assert await client.metric("exporter_ready", "") == 0.0  # what /readyz says, without probing it
        assert await serves(http, traefik.url("web"), f"{iid}.test", status=404)  # still the old snapshot
        assert await serves(http, traefik.url("web"), f"{before}.test", body="blocked")
    finally:
        await etcd_client.delete(bad)
    await eventually(lambda: _converged(client), timeout=20)
    assert await serves(http, traefik.url("web"), f"{iid}.test", body="blocked")
    assert await client.readyz() == (200, [])
    assert await client.metric("exporter_ready", "") == 1.0


async def test_pushes_while_traefik_is_behind_commit_records_at_once_and_their_keys_as_one_revision(
    etcd: EmbeddedEtcd, etcd_client: EtcdClient, traefik: EmbeddedTraefik, http: aiohttp.ClientSession,
    backends: list[Backend],
) -> None:
    backend = await Backend("paced").start()
    backends.append(backend)
    # Traefik takes seconds to recover from the freezing key below: room for the waited push.
    api = {"listen": f"127.0.0.1:{free_port()}", "token": API_TOKEN, "served_timeout": 60}
    daemon = Daemon(settings_for(etcd.url, **_settings(etcd.url, traefik.api, api=api)))
    await daemon.start()
    patient = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90))
    client = Client(daemon, patient)
    try:
        await daemon.parts.reconciler.wait_synced(30)
        await _paced_pushes(client, daemon, etcd_client, traefik, http, backend)
    finally:
        for iid in list(client.pushed):
            await client.remove(iid)
        await daemon.stop()
        await patient.close()


async def _paced_pushes(
    client: Client, daemon: Daemon, etcd_client: EtcdClient, traefik: EmbeddedTraefik, http: aiohttp.ClientSession,
    backend: Backend,
) -> None:
    assert (await client.upsert(uid(), backend.url, wait=True))[0] == 204
    # A key Traefik cannot decode keeps it behind for as long as the test needs.
    bad = f"{ROOT}/http/routers/foreign-{uid()}/priority"
    await etcd_client.put(bad, "abc")
    try:
        behind = uid()
        assert (await client.upsert(behind, backend.url))[0] == 204  # written: Traefik had applied everything
        latest = daemon.parts.reconciler.observed.beacons.latest(ROOT)
        assert latest is not None
        mark = latest.revision
        paced = [uid() for _ in range(5)]
        for iid in paced:
            assert (await client.upsert(iid, backend.url))[0] == 204
        waited = asyncio.create_task(client.upsert(uid(), backend.url, wait=True))
        # Durable, not under the root: records in etcd, keys held, Traefik's root untouched.
        async with http.get(f"{client.api}/v2/ingress?authority={AUTHORITY}", headers={"Authorization": f"Bearer {API_TOKEN}"}) as resp:
            status = {i["id"]: i["status"] for i in (await resp.json())["ingresses"]}
        assert all(status[i]["pending"] is True and status[i]["served"] is False for i in paced)
        assert status[behind]["pending"] is False
        assert _beacons_after(daemon, mark) == 0
        root = await client.root()
        assert root["paced"]["ingresses"] >= len(paced) and root["paced"]["oldest_seconds"] >= 0
        assert (await client.metric("exporter_writer_paced_ingresses") or 0) >= len(paced)
    finally:
        await etcd_client.delete(bad)
    assert (await waited)[0] == 204
    for iid in [*paced, behind]:
        assert await serves(http, traefik.url("web"), f"{iid}.test", body="paced")
    # Everything held (the waited push too) went as one commit under the root.
    assert _beacons_after(daemon, mark) == 1
    assert (await client.root())["paced"] == {"ingresses": 0, "oldest_seconds": 0.0}


async def test_on_a_fresh_root_what_comes_while_traefik_applies_the_first_commit_waits_for_it(
    etcd: EmbeddedEtcd, etcd_client: EtcdClient, http: aiohttp.ClientSession, backends: list[Backend], tmp_path: Path,
) -> None:
    backend = await Backend("fresh").start()
    backends.append(backend)
    authority = uid("fresh")
    root = f"traefik/worker_{authority}"
    # A key Traefik cannot decode: it applies nothing of the root and shows no beacon at all, as while
    # a fresh root's first commit waits in its provider's retry backoff, for as long as the test needs.
    bad = f"{root}/http/routers/foreign-{uid()}/priority"
    await etcd_client.put(bad, "abc")
    traefik = start_traefik(tmp_path, etcd.url, root, ["web"])
    observe = {"api_url": traefik.api, "max_lag": 60, "poll_interval": 0.2}
    daemon = Daemon(settings_for(etcd.url, **_settings(etcd.url, traefik.api, traefik=observe)))
    await daemon.start()
    client = Client(daemon, http, authority)
    try:
        await daemon.parts.reconciler.wait_synced(30)
        first = uid()
        assert (await client.upsert(first, backend.url))[0] == 204  # written: nothing is known to be behind yet
        latest = daemon.parts.reconciler.observed.beacons.latest(root)
        assert latest is not None
        later = [uid() for _ in range(4)]
        for iid in later:
            assert (await client.upsert(iid, backend.url))[0] == 204
        assert _beacons_after(daemon, latest.revision, root) == 0, "held until Traefik shows its first beacon"
        await etcd_client.delete(bad)
        web = traefik.url("web")
        for host in [f"{iid}.test" for iid in [first, *later]]:
            await eventually(functools.partial(serves, http, web, host, body="fresh"), timeout=60)
        assert _beacons_after(daemon, latest.revision, root) == 1, "what waited went as one commit"
    finally:
        await etcd_client.delete(bad)
        for iid in list(client.pushed):
            await client.remove(iid)
        await daemon.stop()
        traefik.stop()


def _beacons_after(daemon: Daemon, revision: int, root: str = ROOT) -> int:
    return sum(1 for w in daemon.parts.reconciler.observed.beacons.history(root) if w.revision > revision)


async def _state_is(client: Client, state: str) -> dict[str, Any] | None:
    root = await client.root()
    return root if root["state"] == state else None


async def test_wait_served_without_a_traefik_is_refused_before_anything_is_written(
    etcd: EmbeddedEtcd, etcd_client: EtcdClient, http: aiohttp.ClientSession
) -> None:
    blind = Daemon(settings_for(etcd.url, **{**_settings(etcd.url, "http://unused:1"), "traefik": {}}))
    await blind.start()
    try:
        await blind.parts.reconciler.wait_synced(30)
        c = Client(blind, http)
        revision = (await etcd_client.get(ROOT + "/_meta/owner"))
        status, body = await c.upsert(uid(), "http://127.0.0.1:9", wait=True)
        assert status == 400 and "traefik.api_url" in body["title"]
        assert (await etcd_client.get(ROOT + "/_meta/owner")) == revision
        assert await c.convergence() == {"traefik": None, "roots": [], "overlapping_roots": []}
        c.pushed.clear()
    finally:
        await blind.stop()


async def test_traefik_stopped_is_unreachable_and_readiness_says_so_after_max_lag(
    tmp_path: Path, etcd: EmbeddedEtcd, http: aiohttp.ClientSession
) -> None:
    own = start_traefik(tmp_path, etcd.url, ROOT, ["web"])
    watcher = Daemon(settings_for(etcd.url, **_settings(etcd.url, own.api)))
    await watcher.start()
    c = Client(watcher, http)
    try:
        await watcher.parts.reconciler.wait_synced(30)
        assert (await c.upsert(uid(), "http://127.0.0.1:9", wait=True))[0] == 204
        own.stop()
        await eventually(lambda: _state_is(c, "unreachable"), timeout=5)
        await eventually(lambda: _ready_reason(c, "traefik unreachable"), timeout=MAX_LAG + 5)
    finally:
        for iid in list(c.pushed):
            await c.remove(iid)
        await watcher.stop()
        own.stop()


async def _ready_reason(client: Client, reason: str) -> bool:
    status, reasons = await client.readyz()
    return status == 503 and any(r.startswith(reason) for r in reasons)


async def test_etcd_stopped_while_idle_readiness_turns_503_in_time_and_back(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    etcd = start_etcd(tmp_path)
    timeout = 1.0
    settings = settings_for(etcd.url, etcd={"endpoints": [etcd.url], "timeout": timeout},
                            api={"enabled": False}, control={"listen": f"127.0.0.1:{free_port()}"})
    idle = Daemon(settings)
    await idle.start()
    control = f"http://{settings.control.listen}"
    c = Client(idle, http)
    c.control = control
    try:
        await eventually(lambda: _ready(c), timeout=30)
        etcd.stop()
        stopped = time.monotonic()
        await eventually(lambda: _ready_reason(c, "etcd unreachable"), timeout=timeout + 5, interval=0.05)
        took = time.monotonic() - stopped
        assert took <= timeout + 2, f"/readyz said 503 after {took:.2f}s"
        # What ExporterNotReady alerts on: an idle daemon writes nothing, so no etcd error is counted.
        assert await c.metric("exporter_ready", "") == 0.0
        await asyncio.to_thread(etcd.restart)
        await eventually(lambda: _ready(c), timeout=10)
        assert await c.metric("exporter_ready", "") == 1.0
    finally:
        await idle.stop()
        etcd.stop()


async def _ready(client: Client) -> bool:
    return (await client.readyz())[0] == 200


async def test_routers_traefik_disables_are_reported_with_its_error(
    tmp_path: Path, etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    # A template whose routers use a middleware no provider defines: Traefik disables them.
    builtin = (BUILTIN_TEMPLATES / "http.json.j2").read_text()
    (tmp_path / "http.json.j2").write_text(
        builtin.replace('"entryPoints": {{ entrypoints | json }}',
                        '"entryPoints": {{ entrypoints | json }}, "middlewares": ["missing@file"]')
    )
    broken = Daemon(settings_for(etcd.url, **_settings(etcd.url, traefik.api), templates={"dir": str(tmp_path)}))
    await broken.start()
    c = Client(broken, http)
    try:
        await broken.parts.reconciler.wait_synced(30)
        iid = uid()
        assert (await c.upsert(iid, "http://127.0.0.1:9", wait=True))[0] == 204
        root = await eventually(lambda: _with_router_errors(c))
        [error] = root["router_errors"]
        assert error["router"] == f"{AUTHORITY}_{iid}" and error["status"] == "disabled"
        assert any("missing@file" in text for text in error["errors"]), error
        async with http.get(f"{c.api}/v2/ingress?authority={AUTHORITY}", headers={"Authorization": f"Bearer {API_TOKEN}"}) as resp:
            entry = next(i for i in (await resp.json())["ingresses"] if i["id"] == iid)
        assert entry["status"]["served"] is True
        assert any("missing@file" in text and "disabled" in text for text in entry["status"]["errors"]), entry
    finally:
        for pushed in list(c.pushed):
            await c.remove(pushed)
        await broken.stop()


async def _with_router_errors(client: Client) -> dict[str, Any] | None:
    root = await client.root()
    return root if root["router_errors"] else None
