"""Several sidecars on one root: idempotent pushes, leader election and failover, fencing, one health truth."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, free_port
from exporter.etcd.client import EtcdClient
from tests.conftest import ROOT
from tests.helpers import (
    AUTHORITY,
    Backend,
    eventually,
    is_ready,
    serves,
    start_daemon,
    stop_daemon,
    uid,
)

pytestmark = pytest.mark.integration
TOKEN = "sidecar-test-token"
TTL = 3


@dataclass
class Sidecar:
    proc: subprocess.Popen[bytes]
    api: str
    control: str

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Group:
    sidecars: list[Sidecar]
    records: str
    election_key: str


@pytest.fixture
async def group(tmp_path: Path, etcd: EmbeddedEtcd, etcd_client: EtcdClient, http: aiohttp.ClientSession) -> AsyncIterator[Group]:
    space = uid("sc")
    config = tmp_path / "exporter.yaml"
    config.write_text(
        f'etcd: {{endpoints: ["{etcd.url}"]}}\nrecords_prefix: "{space}/records"\n'
        f"leader: {{ttl: {TTL}}}\nwriter: {{reconcile_interval: 5}}\n"
    )
    sidecars = []
    for n in range(3):
        api, control = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        env = {"EXPORTER_API__TOKEN": TOKEN, "EXPORTER_API__LISTEN": api, "EXPORTER_CONTROL__LISTEN": control,
               "EXPORTER_LOG__FORMAT": "json"}
        proc = start_daemon(config, tmp_path / f"sidecar{n}.log", env=env)
        sidecars.append(Sidecar(proc, f"http://{api}", f"http://{control}"))
    group = Group(sidecars, f"{space}/records", f"{space}/records.leader")
    try:
        for sidecar in sidecars:
            await eventually(lambda: is_ready(http, sidecar.control), timeout=30)
        await eventually(lambda: leader_of(etcd_client, group), timeout=10)
        yield group
    finally:
        for sidecar in sidecars:
            stop_daemon(sidecar.proc)
        await _remove_all(etcd_client, space)


async def _remove_all(client: EtcdClient, space: str) -> None:
    # Delete what the group wrote: its records, and its objects under the shared test root.
    page = await client.range_prefix(f"{space}/records/{AUTHORITY}/")
    for kv in page.kvs:
        iid = kv.key.rsplit("/", 1)[1]
        for kind in ("routers", "services"):
            await client.delete_prefix(f"{ROOT}/http/{kind}/{AUTHORITY}_{iid}/")
    await client.delete_prefix(f"{space}/")
    await client.delete_prefix(f"{space}/records.")


def ing(iid: str, upstream: dict[str, Any], revision: int = 1, health: dict[str, Any] | None = None) -> dict[str, Any]:
    body = {"authority": AUTHORITY, "id": iid, "revision": revision, "hosts": [f"{iid}.test"], "upstream": upstream}
    if health:
        body["health_check"] = health
    return body


async def push(http: aiohttp.ClientSession, sidecar: Sidecar, *ingresses: dict[str, Any]) -> int:
    async with http.post(f"{sidecar.api}/v2/ingress/upsert", json={"ingresses": list(ingresses)},
                         headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
        return resp.status


async def leader_of(client: EtcdClient, group: Group) -> Sidecar | None:
    kv = await client.get(group.election_key)
    if kv is None:
        return None
    pid = int(kv.value.split(":")[1])
    return next((s for s in group.sidecars if s.pid == pid), None)


async def committed_txns(http: aiohttp.ClientSession, sidecar: Sidecar) -> float:
    async with http.get(f"{sidecar.control}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        if family.name == "exporter_etcd_txns":
            return sum(s.value for s in family.samples if s.name.endswith("_total") and s.labels.get("result") == "committed")
    return 0.0


async def test_identical_pushes_to_three_sidecars_cost_what_one_costs(
    group: Group, etcd_client: EtcdClient, http: aiohttp.ClientSession, traefik: EmbeddedTraefik, backends: list[Backend]
) -> None:
    backends.append(await Backend("served").start())
    up = {"servers": [{"url": backends[0].url}]}
    single_ids = [uid() for _ in range(200)]
    start = await etcd_client.revision()
    for iid in single_ids:
        assert await push(http, group.sidecars[0], ing(iid, up)) == 204
    single = await etcd_client.revision() - start

    shared_ids = [uid() for _ in range(200)]
    start = await etcd_client.revision()
    for iid in shared_ids:
        statuses = await asyncio.gather(*(push(http, s, ing(iid, up)) for s in group.sidecars))
        assert statuses == [204, 204, 204]
    assert await etcd_client.revision() - start == single == 200
    for iid in shared_ids:
        await eventually(lambda: serves(http, traefik.url("web"), f"{iid}.test", body="served"))


async def checked_ingress(
    http: aiohttp.ClientSession, sidecar: Sidecar, client: EtcdClient, backends: list[Backend]
) -> tuple[str, Backend, Backend]:
    """Two backends behind one health-checked ingress, pushed to `sidecar` and in place."""
    a, b = await Backend("a").start(), await Backend("b").start()
    backends.extend([a, b])
    iid = uid()
    health = {"enable": True, "interval": 0.3, "max_retries": 2, "max_wait_time": 0.5, "initial_delay": 0}
    assert await push(http, sidecar, ing(iid, {"servers": [{"url": a.url}, {"url": b.url}]}, health=health)) == 204
    await eventually(lambda: _urls_are(client, iid, {a.url, b.url}), timeout=20)
    return iid, a, b


async def test_sigkill_the_leader_a_successor_takes_over_and_still_ejects(
    group: Group, etcd_client: EtcdClient, http: aiohttp.ClientSession, backends: list[Backend]
) -> None:
    iid, a, b = await checked_ingress(http, group.sidecars[0], etcd_client, backends)
    leader = await eventually(lambda: leader_of(etcd_client, group))
    leader.proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    successor = await eventually(lambda: _new_leader(etcd_client, group, leader), timeout=TTL + 5, interval=0.05)
    took = time.monotonic() - killed
    assert took <= TTL + 1, f"takeover after {took:.2f}s"
    assert successor is not leader
    # The successor starts from the published health: no spurious ejection at takeover.
    await eventually(lambda: _health_leader_is(http, successor), timeout=5)
    assert await _urls_are(etcd_client, iid, {a.url, b.url})
    await b.stop()
    await eventually(lambda: _urls_are(etcd_client, iid, {a.url}), timeout=10)


async def test_a_paused_leader_commits_nothing_after_losing_its_lease_then_follows(
    group: Group, etcd_client: EtcdClient, http: aiohttp.ClientSession, backends: list[Backend]
) -> None:
    iid, a, b = await checked_ingress(http, group.sidecars[1], etcd_client, backends)
    old = await eventually(lambda: leader_of(etcd_client, group))
    before = await committed_txns(http, old)
    old.proc.send_signal(signal.SIGSTOP)
    try:
        await eventually(lambda: _new_leader(etcd_client, group, old), timeout=TTL + 5, interval=0.05)
        # While it sleeps, a backend dies: the new leader ejects it; the old one, when it wakes
        # up, sees the same failure but its fenced writes must all fail.
        await b.stop()
        await eventually(lambda: _urls_are(etcd_client, iid, {a.url}), timeout=10)
    finally:
        old.proc.send_signal(signal.SIGCONT)
    await eventually(lambda: _is_follower(http, old), timeout=TTL + 5)
    # Give it every chance to write: several probe rounds and a reconcile.
    await b.start()
    await eventually(lambda: _urls_are(etcd_client, iid, {a.url, b.url}), timeout=10)
    assert await committed_txns(http, old) == before


async def test_every_sidecar_reports_the_same_health(
    group: Group, etcd_client: EtcdClient, http: aiohttp.ClientSession, backends: list[Backend]
) -> None:
    iid, _a, b = await checked_ingress(http, group.sidecars[2], etcd_client, backends)
    await eventually(lambda: _agree(http, group, iid, {"healthy"}), timeout=20)
    await b.stop()
    await eventually(lambda: _agree(http, group, iid, {"healthy", "unhealthy"}), timeout=20)
    await b.start()
    await eventually(lambda: _agree(http, group, iid, {"healthy"}), timeout=20)
    for sidecar in group.sidecars:
        async with http.get(f"{sidecar.control}/v1/healthcheck") as resp:
            assert resp.headers["X-Health-Leader"]
    # /metrics agree too: every sidecar counts the leader's node states.
    await eventually(lambda: _metrics_agree(http, group), timeout=10)


async def _agree(http: aiohttp.ClientSession, group: Group, iid: str, statuses: set[str]) -> bool:
    answers = []
    for sidecar in group.sidecars:
        async with http.get(f"{sidecar.control}/v1/healthcheck/{AUTHORITY}/{iid}/checkers") as resp:
            answers.append(await resp.json())
    nodes = [{(n["port"], n["status"]) for e in answer for n in e["nodes"]} for answer in answers]
    return all(n == nodes[0] for n in nodes) and {s for _, s in nodes[0]} == statuses and len(nodes[0]) == 2


async def _health_leader_is(http: aiohttp.ClientSession, sidecar: Sidecar) -> bool:
    async with http.get(f"{sidecar.control}/v1/healthcheck") as resp:
        return f":{sidecar.pid}:" in resp.headers.get("X-Health-Leader", "")


async def _metrics_agree(http: aiohttp.ClientSession, group: Group) -> bool:
    seen = []
    for sidecar in group.sidecars:
        async with http.get(f"{sidecar.control}/metrics") as resp:
            families = {f.name: f for f in text_string_to_metric_families(await resp.text())}
        seen.append({s.labels["state"]: s.value for s in families["exporter_health_nodes"].samples})
    return all(s == seen[0] for s in seen) and seen[0].get("healthy", 0) >= 2


async def _is_follower(http: aiohttp.ClientSession, sidecar: Sidecar) -> bool:
    async with http.get(f"{sidecar.control}/metrics") as resp:
        text = await resp.text()
    return "exporter_leader 0.0" in text


async def _new_leader(client: EtcdClient, group: Group, old: Sidecar) -> Sidecar | None:
    leader = await leader_of(client, group)
    return leader if leader is not None and leader is not old else None


async def _urls_are(client: EtcdClient, iid: str, urls: set[str]) -> bool:
    kvs = (await client.range_prefix(f"{ROOT}/http/services/{AUTHORITY}_{iid}/")).kvs
    return {kv.value for kv in kvs if kv.key.endswith("/url")} == urls
