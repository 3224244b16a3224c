"""health.sharding on, three sidecars on real etcd and Traefik: each target probed by one sidecar, the leader deciding.

The backends record the User-Agent of every probe, which names the sidecar that sent it.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By

from exporter.embedded import EmbeddedEtcd, free_port
from exporter.etcd.client import EtcdClient
from tests.conftest import ROOT
from tests.helpers import AUTHORITY, Backend, eventually, is_ready, start_daemon, stop_daemon, uid

pytestmark = pytest.mark.integration
TOKEN = "shard-test-token"
TTL = 3
FAST = {"enable": True, "interval": 0.2, "max_retries": 2, "max_wait_time": 0.5, "initial_delay": 0}
# The health suite's bound for one exporter (interval x max_retries, a writer window, slack), and the
# observation's hop from the sidecar probing to the leader (a 50 ms batch and one watch event).
EJECTION_BOUND = 0.2 * 2 + 0.02 + 0.5 + 0.6 + 0.3


@dataclass
class Sidecar:
    proc: subprocess.Popen[bytes]
    api: str
    control: str
    identity: str = ""

    def sent(self, agent: str) -> bool:
        """True when a probe's User-Agent names this sidecar."""
        return bool(self.identity) and agent.endswith(f"({self.identity})")


@dataclass
class Fleet:
    tmp_path: Path
    config: Path
    space: str
    http: aiohttp.ClientSession
    etcd_client: EtcdClient
    sidecars: list[Sidecar] = field(default_factory=list)

    async def add(self) -> Sidecar:
        api, control = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        env = {"EXPORTER_API__TOKEN": TOKEN, "EXPORTER_API__LISTEN": api, "EXPORTER_CONTROL__LISTEN": control}
        proc = start_daemon(self.config, self.tmp_path / f"sidecar{len(self.sidecars)}.log", env=env)
        sidecar = Sidecar(proc, f"http://{api}", f"http://{control}")
        self.sidecars.append(sidecar)
        await eventually(lambda: is_ready(self.http, sidecar.control), timeout=30)
        sidecar.identity = await eventually(lambda: self._announced(proc.pid), timeout=10)
        return sidecar

    async def _announced(self, pid: int) -> str | None:
        page = await self.etcd_client.range_prefix(f"{self.space}/records.health.shards/")
        return next((kv.key.rsplit("/", 1)[1] for kv in page.kvs if kv.key.count("/") == 2 and f":{pid}:" in kv.key), None)

    def live(self) -> list[Sidecar]:
        return [s for s in self.sidecars if s.proc.poll() is None]

    def by_agent(self, agent: str) -> Sidecar | None:
        return next((s for s in self.sidecars if s.sent(agent)), None)

    async def leader(self) -> Sidecar | None:
        kv = await self.etcd_client.get(f"{self.space}/records.leader")
        return next((s for s in self.sidecars if kv is not None and kv.value == s.identity), None)

    async def push(self, *ingresses: dict[str, Any]) -> None:
        async with self.http.post(f"{self.live()[0].api}/v2/ingress/upsert", json={"ingresses": list(ingresses)},
                                  headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 204, await resp.text()


@pytest.fixture
async def fleet(tmp_path: Path, etcd: EmbeddedEtcd, etcd_client: EtcdClient, http: aiohttp.ClientSession) -> AsyncIterator[Fleet]:
    space = uid("sh")
    config = tmp_path / "exporter.yaml"
    config.write_text(
        f'etcd: {{endpoints: ["{etcd.url}"]}}\nrecords_prefix: "{space}/records"\n'
        f"leader: {{ttl: {TTL}}}\nhealth: {{sharding: \"on\"}}\nlog: {{format: json}}\n"
    )
    group = Fleet(tmp_path, config, space, http, etcd_client)
    try:
        yield group
    finally:
        for sidecar in group.sidecars:
            stop_daemon(sidecar.proc)
        page = await etcd_client.range_prefix(f"{space}/records/{AUTHORITY}/")
        for kv in page.kvs:
            for kind in ("routers", "services"):
                await etcd_client.delete_prefix(f"{ROOT}/http/{kind}/{AUTHORITY}_{kv.key.rsplit('/', 1)[1]}/")
        await etcd_client.delete_prefix(f"{space}/")
        await etcd_client.delete_prefix(f"{space}/records.")


def ing(iid: str, *urls: str, health: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"authority": AUTHORITY, "id": iid, "revision": 1, "hosts": [f"{iid}.test"],
            "upstream": {"servers": [{"url": u} for u in urls]}, "health_check": health or FAST}


async def urls_in_etcd(client: EtcdClient, iid: str) -> set[str]:
    kvs = (await client.range_prefix(f"{ROOT}/http/services/{AUTHORITY}_{iid}")).kvs
    return {kv.value for kv in kvs if kv.key.endswith("/url")}


async def probers(http: aiohttp.ClientSession, sidecar: Sidecar) -> dict[tuple[str, int], str]:
    """(checker name, port) -> the sidecar `/v1/healthcheck` names as probing it."""
    async with http.get(f"{sidecar.control}/v1/healthcheck") as resp:
        body = await resp.json()
    return {(e["name"], n["port"]): n.get("prober") for e in body for n in e["nodes"]}


async def all_probers(http: aiohttp.ClientSession, sidecar: Sidecar, count: int) -> dict[tuple[str, int], str]:
    """`probers` once the sidecar reports at least `count` nodes, each with its prober (the leader publishes soon after a change)."""
    async def complete() -> dict[tuple[str, int], str] | None:
        got = await probers(http, sidecar)
        return got if len(got) >= count and None not in got.values() else None

    return await eventually(complete, timeout=10)


async def gauge(http: aiohttp.ClientSession, sidecar: Sidecar, name: str) -> dict[str, float]:
    async with http.get(f"{sidecar.control}/metrics") as resp:
        text = await resp.text()
    return {s.labels.get("sidecar", ""): s.value for f in text_string_to_metric_families(text) if f.name == name for s in f.samples}


async def settled(fleet: Fleet, nodes: int) -> bool:
    """Every live sidecar sees all of them, counts `nodes` in all, and no node probed by two."""
    names = {s.identity for s in fleet.live()}
    for sidecar in fleet.live():
        shares = await gauge(fleet.http, sidecar, "exporter_health_shard_targets")
        if set(shares) != names or sum(shares.values()) != nodes:
            return False
        if (await gauge(fleet.http, sidecar, "exporter_health_probed_by_several")).get("") != 0:
            return False
    return True


def agents_since(backend: Backend, since: float) -> Counter[str]:
    return Counter(agent for at, agent in backend.probes if at >= since)


async def started_fleet(fleet: Fleet, backends: list[Backend], count: int, targets: int) -> list[tuple[str, Backend]]:
    """`count` sidecars and `targets` ingresses of one backend each, all routed, the shares settled."""
    for _ in range(count):
        await fleet.add()
    pairs = []
    for _ in range(targets):
        backend = await Backend("b").start()
        backends.append(backend)
        pairs.append((uid(), backend))
    await fleet.push(*(ing(iid, b.url) for iid, b in pairs))
    await eventually(lambda: _all_routed(fleet.etcd_client, pairs), timeout=20)
    await eventually(lambda: settled(fleet, targets), timeout=15)
    return pairs


async def with_spare(fleet: Fleet, backends: list[Backend], iid: str, backend: Backend, health: dict[str, Any] | None = None) -> Backend:
    """A second server beside `backend`, in place: it keeps the ingress routable (the all-down policy keeps a lone server)."""
    spare = await Backend("spare").start()
    backends.append(spare)
    await fleet.push({**ing(iid, backend.url, spare.url, health=health), "revision": 2})
    await eventually(lambda: _is(urls_in_etcd(fleet.etcd_client, iid), {backend.url, spare.url}), timeout=20)
    return spare


async def _is(got: Awaitable[set[str]], want: set[str]) -> bool:
    return await got == want


async def _all_routed(client: EtcdClient, pairs: list[tuple[str, Backend]]) -> bool:
    return all([await urls_in_etcd(client, iid) == {b.url} for iid, b in pairs])


async def test_every_target_is_probed_by_exactly_one_sidecar_per_interval(
    fleet: Fleet, backends: list[Backend], http: aiohttp.ClientSession
) -> None:
    pairs = await started_fleet(fleet, backends, 3, 12)
    written = await _shard_keys(fleet)
    since = time.monotonic()
    await eventually(lambda: _all_probed(pairs, since, 10), timeout=15)
    elapsed = time.monotonic() - since
    # While states hold, sharding writes nothing: every announcement and observation as it was.
    assert await _shard_keys(fleet) == written
    reported = await all_probers(http, fleet.sidecars[0], len(pairs))
    senders = set()
    for iid, backend in pairs:
        agents = agents_since(backend, since)
        assert len(agents) == 1, f"{iid} probed by {dict(agents)}"
        (agent, probes), = agents.items()
        # One sidecar's schedule: an interval of 0.2 s (jittered by 5 %), never three sidecars' worth.
        assert probes <= elapsed / 0.19 + 2, (iid, probes, elapsed)
        sender = fleet.by_agent(agent)
        assert sender is not None, agent
        senders.add(sender.identity)
        assert reported[(f"{AUTHORITY}/{iid}/primary", backend.port)] == sender.identity
    assert len(senders) > 1, "the targets are spread over the sidecars"
    # Every sidecar answers the same.
    for sidecar in fleet.sidecars[1:]:
        assert await all_probers(http, sidecar, len(pairs)) == reported


async def _shard_keys(fleet: Fleet) -> dict[str, int]:
    page = await fleet.etcd_client.range_prefix(f"{fleet.space}/records.health.shards/")
    return {kv.key: kv.mod_revision for kv in page.kvs}


async def _all_probed(pairs: list[tuple[str, Backend]], since: float, at_least: int) -> bool:
    return all(sum(agents_since(b, since).values()) >= at_least for _, b in pairs)


async def test_a_backend_another_sidecar_probes_is_ejected_within_the_bound(
    fleet: Fleet, backends: list[Backend], etcd_client: EtcdClient, http: aiohttp.ClientSession
) -> None:
    pairs = await started_fleet(fleet, backends, 3, 6)
    leader = await eventually(fleet.leader)
    reported = await all_probers(http, leader, len(pairs))
    iid, backend = next((i, b) for i, b in pairs if reported[(f"{AUTHORITY}/{i}/primary", b.port)] != leader.identity)
    spare = await with_spare(fleet, backends, iid, backend)
    await backend.stop()
    died = time.monotonic()
    await eventually(lambda: _is(urls_in_etcd(etcd_client, iid), {spare.url}), interval=0.01)
    took = time.monotonic() - died
    assert took <= EJECTION_BOUND, took
    await backend.start()
    await eventually(lambda: _is(urls_in_etcd(etcd_client, iid), {backend.url, spare.url}))


@pytest.mark.parametrize("who", ["follower", "leader"])
async def test_a_killed_sidecar_s_targets_are_taken_over_without_spurious_ejection(
    fleet: Fleet, backends: list[Backend], etcd_client: EtcdClient, who: str
) -> None:
    # 24 targets: a given sidecar of three owns none of them once in 1/(2/3)^24 (16,000) fleets; with 12 it was once in 130.
    pairs = await started_fleet(fleet, backends, 3, 24)
    leader = await eventually(fleet.leader)
    victim = leader if who == "leader" else next(s for s in fleet.sidecars if s is not leader)
    since = time.monotonic()
    await eventually(lambda: _all_probed(pairs, since, 2))
    theirs = [(iid, b) for iid, b in pairs if any(victim.sent(a) for a in agents_since(b, since))]
    assert theirs, "the victim probes a share"
    victim.proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()

    ejected: list[str] = []

    async def taken_over() -> bool:
        # Meanwhile, nothing is ejected: every target stays in its load balancer.
        ejected.extend([iid for iid, b in pairs if await urls_in_etcd(etcd_client, iid) != {b.url}])
        return all(any(not victim.sent(a) for a in agents_since(b, killed)) for _, b in theirs)

    await eventually(taken_over, timeout=TTL + 5, interval=0.1)
    took = time.monotonic() - killed
    assert not ejected, f"ejected during the takeover: {sorted(set(ejected))}"
    assert took <= TTL + 0.2 + 1, f"taken over after {took:.2f}s"
    await eventually(lambda: settled(fleet, len(pairs)), timeout=10)
    for iid, b in pairs:
        assert await urls_in_etcd(etcd_client, iid) == {b.url}


async def test_a_sidecar_added_takes_only_its_own_share(
    fleet: Fleet, backends: list[Backend], http: aiohttp.ClientSession
) -> None:
    backend = await Backend("shared").start()
    backends.append(backend)
    await fleet.add()
    await fleet.add()
    # Sixty targets: one server each (one backend behind them all), told apart by their ingress.
    ids = [uid() for _ in range(60)]
    await fleet.push(*(ing(iid, backend.url, health={**FAST, "interval": 1.0}) for iid in ids))
    await eventually(lambda: settled(fleet, 60), timeout=20)
    before = await all_probers(http, fleet.sidecars[0], 60)
    newcomer = await fleet.add()
    await eventually(lambda: settled(fleet, 60), timeout=15)
    after = await all_probers(http, fleet.sidecars[0], 60)
    moved = {node for node, who in after.items() if who != before[node]}
    assert all(after[node] == newcomer.identity for node in moved), "only the newcomer's share moves"
    # About a third: 20 expected; 8 to 32 holds at more than three standard deviations.
    assert 8 <= len(moved) <= 32, len(moved)


async def test_a_sidecar_cut_off_past_its_lease_never_outvotes_fresh_observations(
    fleet: Fleet, backends: list[Backend], etcd_client: EtcdClient, http: aiohttp.ClientSession
) -> None:
    pairs = await started_fleet(fleet, backends, 3, 9)
    leader = await eventually(fleet.leader)
    reported = await all_probers(http, leader, len(pairs))
    stale = next(s for s in fleet.sidecars if s is not leader and s.identity in reported.values())
    iid, backend = next((i, b) for i, b in pairs if reported[(f"{AUTHORITY}/{i}/primary", b.port)] == stale.identity)
    # Probes that time out after 2 s: back from its pause, the sidecar needs seconds to see the server dead itself.
    spare = await with_spare(fleet, backends, iid, backend, {**FAST, "max_wait_time": 2.0})
    node = (f"{AUTHORITY}/{iid}/primary", backend.port)
    # Paused past its lease, the sidecar still believes the server healthy; meanwhile it hangs and the others eject it.
    stale.proc.send_signal(signal.SIGSTOP)
    await eventually(lambda: _prober_is_not(http, leader, node, stale.identity), timeout=TTL + 5)
    backend.hang = True
    await eventually(lambda: _is(urls_in_etcd(etcd_client, iid), {spare.url}), timeout=15)
    stale.proc.send_signal(signal.SIGCONT)

    returned: list[set[str]] = []

    async def back_in_its_share() -> bool:
        if (urls := await urls_in_etcd(etcd_client, iid)) != {spare.url}:
            returned.append(urls)
        return (await probers(http, leader)).get(node) == stale.identity and await settled(fleet, len(pairs) + 1)

    await eventually(back_in_its_share, timeout=TTL + 10, interval=0.05)
    assert not returned, f"a stale observation put the dead server back: {returned[0]}"
    # Back in its share, it continues from the verdict, not from what it believed when cut off.
    await eventually(lambda: _status_is(http, stale, node, "unhealthy"))
    assert await urls_in_etcd(etcd_client, iid) == {spare.url}


async def _prober_is_not(http: aiohttp.ClientSession, sidecar: Sidecar, node: tuple[str, int], identity: str) -> bool:
    return (await probers(http, sidecar)).get(node) not in (None, identity)


async def _status_is(http: aiohttp.ClientSession, sidecar: Sidecar, node: tuple[str, int], status: str) -> bool:
    async with http.get(f"{sidecar.control}/v1/healthcheck") as resp:
        body = await resp.json()
    return any((e["name"], n["port"]) == node and n["status"] == status for e in body for n in e["nodes"])


async def test_the_status_page_names_the_sidecar_probing_each_server(
    fleet: Fleet, backends: list[Backend], http: aiohttp.ClientSession, browser: Any
) -> None:
    pairs = await started_fleet(fleet, backends, 2, 4)
    leader = await eventually(fleet.leader)
    follower = next(s for s in fleet.sidecars if s is not leader)
    reported = await all_probers(http, follower, len(pairs))
    await asyncio.to_thread(browser.get, f"{follower.control}/")
    for iid, backend in pairs:
        who = reported[(f"{AUTHORITY}/{iid}/primary", backend.port)]
        cell = f'#rows tr[data-key="{AUTHORITY}/{iid}"] td.servers'
        await eventually(functools.partial(_shown, browser, cell, f"probed by {who}"), timeout=10, interval=0.1)
    assert set(reported.values()) <= {s.identity for s in fleet.sidecars}
    # The page leaves before its sidecars stop: its live updates would fail against them.
    await asyncio.to_thread(browser.get, "about:blank")


async def _shown(browser: Any, css: str, text: str) -> bool:
    def read() -> str:
        try:
            return str(browser.find_element(By.CSS_SELECTOR, css).text)
        except (StaleElementReferenceException, NoSuchElementException):
            return ""  # replaced by a live update, or not rendered yet

    return text in await asyncio.to_thread(read)
