"""A real 3-member etcd cluster: members die in the middle of a burst of pushes; nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from exporter.daemon import Daemon
from exporter.embedded import free_port, start_traefik
from exporter.etcd.client import EtcdClient
from tests.conftest import API_TOKEN, settings_for
from tests.etcd_cluster import leader_of, start_cluster
from tests.helpers import AUTHORITY, Backend, eventually, serves, uid

pytestmark = pytest.mark.integration
TIMEOUT = 2.0
CLIENTS, PUSHES = 6, 12


class Burst:
    """Coordinator clients pushing new ingresses one per request, recording every answer."""

    def __init__(self, http: aiohttp.ClientSession, api: str, url: str) -> None:
        self.http, self.api, self.url = http, api, url
        self.answers: list[tuple[str, int, float]] = []

    async def push(self, iid: str) -> int:
        body = {"ingresses": [{"authority": AUTHORITY, "id": iid, "revision": 1, "hosts": [f"{iid}.test"],
                               "upstream": {"servers": [{"url": self.url}]}}]}
        async with self.http.post(f"{self.api}/v2/ingress/upsert", json=body,
                                  headers={"Authorization": f"Bearer {API_TOKEN}"}) as resp:
            self.answers.append((iid, resp.status, time.monotonic()))
            return resp.status

    async def client(self, ids: list[str]) -> None:
        for iid in ids:
            await self.push(iid)


async def _readiness(http: aiohttp.ClientSession, control: str, seen: list[tuple[float, int, list[str]]]) -> None:
    while True:
        async with http.get(f"{control}/readyz") as resp:
            seen.append((time.monotonic(), resp.status, (await resp.json())["reasons"]))
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("victim", ["the member the exporter talks to", "the raft leader"])
async def test_a_member_killed_mid_burst_loses_nothing_and_writes_resume(
    tmp_path: Path, http: aiohttp.ClientSession, backends: list[Backend], victim: str
) -> None:
    cluster = start_cluster(tmp_path)
    endpoints = [m.url for m in cluster]
    space = uid("cl")
    root_key = f"{space}/worker_{{authority}}"
    root = f"{space}/worker_{AUTHORITY}"
    traefik = start_traefik(tmp_path, ",".join(e.removeprefix("http://") for e in endpoints), root, ["web"])
    backend = await Backend("cluster").start()
    backends.append(backend)
    control_listen = f"127.0.0.1:{free_port()}"
    settings = settings_for(
        endpoints[0], etcd={"endpoints": endpoints, "timeout": TIMEOUT}, root_key=root_key,
        records_prefix=f"{space}/records", api={"listen": f"127.0.0.1:{free_port()}", "token": API_TOKEN},
        control={"listen": control_listen}, traefik={"api_url": traefik.api, "max_lag": 10},
    )
    daemon = Daemon(settings)
    seen: list[tuple[float, int, list[str]]] = []
    watcher: asyncio.Task[None] | None = None
    try:
        await daemon.start()
        await daemon.parts.reconciler.wait_synced(30)
        burst = Burst(http, f"http://{settings.api.listen}", backend.url)
        watcher = asyncio.create_task(_readiness(http, f"http://{control_listen}", seen))
        ids = [[uid() for _ in range(PUSHES)] for _ in range(CLIENTS)]
        clients = [asyncio.create_task(burst.client(batch)) for batch in ids]
        await eventually(lambda: _answered(burst, CLIENTS * PUSHES // 3), timeout=30, interval=0.01)
        raft_leader = victim == "the raft leader"
        dead = leader_of(cluster) if raft_leader else next(m for m in cluster if m.url == daemon.parts.etcd.endpoint)
        dead.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        await asyncio.gather(*clients)

        # Writes resume: the first acknowledged push after the kill comes within 2 x etcd.timeout.
        retried = [iid for iid, status, _at in burst.answers if status != 204]
        for iid in retried:
            await eventually(lambda: _acknowledged(burst, iid), timeout=20)
        resumed = min(at for _iid, status, at in burst.answers if status == 204 and at > killed)
        assert resumed - killed <= 2 * TIMEOUT, f"{victim}: writes resumed after {resumed - killed:.2f}s"
        assert {status for _iid, status, _at in burst.answers} <= {204, 503}

        # Every acknowledged ingress is in etcd and served.
        acknowledged = {iid for iid, status, _at in burst.answers if status == 204}
        assert acknowledged == {iid for batch in ids for iid in batch}
        alive = [m.url for m in cluster if m is not dead]
        async with EtcdClient(alive) as client:
            records = (await client.range_prefix(f"{space}/records/{AUTHORITY}/")).kvs
        assert {kv.key.rsplit("/", 1)[1] for kv in records} == acknowledged
        for iid in sorted(acknowledged):
            await eventually(lambda: serves(http, traefik.url("web"), f"{iid}.test", body="cluster"), timeout=20)

        # /readyz told the truth: ready again once writes resumed, and ready at the end.
        await eventually(lambda: _ready_since(seen, resumed), timeout=2 * TIMEOUT + 5)
        assert seen[-1][1] == 200, seen[-1]
    finally:
        if watcher is not None:
            watcher.cancel()
        await daemon.stop()
        traefik.stop()
        for member in cluster:
            member.stop()


async def _answered(burst: Burst, n: int) -> bool:
    return len(burst.answers) >= n


async def _acknowledged(burst: Burst, iid: str) -> bool:
    return await burst.push(iid) == 204


async def _ready_since(seen: list[tuple[float, int, list[str]]], since: float) -> bool:
    return any(at > since and status == 200 for at, status, _reasons in seen)
