"""Everything a campaign runs: a 3-member etcd cluster (each member reached by its peers through a
link of its own), two Traefiks, three sidecars on one root (each reaching etcd through links of
its own), and real HTTP backends, on stable loopback ports so that each can be killed and started
again where it was."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, traefik_binary, traefik_static_args, wait_http
from tests.etcd_cluster import leader_of, stable_port, start_cluster
from tests.helpers import Backend

from .link import Link

TOKEN = "campaign-token"
AUTHORITIES = ("ca", "cb")  # the sidecars' root and a second one
ROOT = "traefik/worker_ca"
RECORDS = "traefik-etcd-exporter/records"
LEADER_TTL = 3
QUOTA_BYTES = 64 * 2**20  # etcd's backend quota: small, so that the nospace fault fills it in seconds


def root_of(authority: str) -> str:
    """The Traefik root of an authority (the default `root_key`)."""
    return f"traefik/worker_{authority}"


@dataclass
class Sidecar:
    """One exporter daemon: its config, its links to etcd, its process (restarted on the same ports)."""

    name: str
    config: Path
    log: Path
    links: list[Link]
    command: list[str]
    api: str = field(default_factory=lambda: f"http://127.0.0.1:{stable_port()}")
    control: str = field(default_factory=lambda: f"http://127.0.0.1:{stable_port()}")
    proc: subprocess.Popen[bytes] | None = None
    incarnation: int = 0

    @property
    def label(self) -> str:
        """Name and incarnation: RSS is compared within one process."""
        return f"{self.name}#{self.incarnation}"

    def start(self) -> None:
        env = {**os.environ, "EXPORTER_API__TOKEN": TOKEN, "EXPORTER_API__LISTEN": self.api.removeprefix("http://"),
               "EXPORTER_CONTROL__LISTEN": self.control.removeprefix("http://"), "EXPORTER_LOG__FORMAT": "json"}
        self.incarnation += 1
        self.proc = subprocess.Popen([*self.command, "run", "--config", str(self.config)], env=env,
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def rss_mb(self) -> float | None:
        """Resident memory now, from /proc (None when not running)."""
        if not self.alive():
            return None
        assert self.proc is not None
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None


@dataclass
class Traefik:
    """A Traefik on the root, restartable on the same ports."""

    name: str
    workdir: Path
    endpoints: str
    web_port: int = field(default_factory=stable_port)
    api_port: int = field(default_factory=stable_port)
    child: EmbeddedTraefik | None = None

    @property
    def web(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def start(self) -> None:
        log = self.workdir / f"{self.name}.log"
        args = [traefik_binary(), *traefik_static_args(self.endpoints, ROOT, {"web": self.web_port, "traefik": self.api_port})]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAEFIK_")}
        proc = subprocess.Popen(args, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)
        self.child = EmbeddedTraefik(proc=proc, log=log, entrypoints={"web": self.web_port}, api_port=self.api_port)
        wait_http(self.api + "/api/overview", time.monotonic() + 30, proc, self.name, log)

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()


class World:
    """Starts and stops the whole set-up; the faults act on its parts."""

    def __init__(self, workdir: Path, sidecar_command: list[str] | None = None, backends: int = 4,
                 etcd_binary: str | None = None) -> None:
        self.workdir = workdir
        self.etcd_binary = etcd_binary
        self.command = sidecar_command or [sys.executable, "-m", "exporter"]
        self.members: list[EmbeddedEtcd] = []
        self.peer_links: list[Link] = []  # each member's peers reach it through its own
        self.member_ids: list[str] = []  # raft ids in hex, as a peer names itself on its requests
        self.traefiks: list[Traefik] = []
        self.sidecars: list[Sidecar] = []
        self.backends = [Backend(f"backend-{n}", port=stable_port()) for n in range(backends)]

    @property
    def endpoints(self) -> list[str]:
        return [m.url for m in self.members]

    async def start(self, http: aiohttp.ClientSession) -> None:
        """Bring everything up and wait until every sidecar is ready and one leads."""
        peers = [stable_port() for _ in range(3)]
        self.peer_links = [Link(stable_port(), port) for port in peers]
        for link in self.peer_links:
            await link.start()
        self.members = await asyncio.to_thread(
            start_cluster, self.workdir, binary=self.etcd_binary, peers=peers, advertised_peers=[link.port for link in self.peer_links],
            extra_args=["--quota-backend-bytes", str(QUOTA_BYTES)],
        )
        await self.learn_member_ids(http)
        for backend in self.backends:
            await backend.start()
        joined = ",".join(url.removeprefix("http://") for url in self.endpoints)
        self.traefiks = [Traefik(f"traefik-{n}", self.workdir, joined) for n in range(2)]
        for traefik in self.traefiks:
            await asyncio.to_thread(traefik.start)
        for n in range(3):
            links = [Link(stable_port(), member.client_port) for member in self.members]
            for link in links:
                await link.start()
            config = self.workdir / f"sidecar-{n}.yaml"
            traefik = self.traefiks[n % 2]
            endpoints = ", ".join(f'"{link.url}"' for link in links)
            config.write_text(
                f"etcd: {{endpoints: [{endpoints}]}}\nleader: {{ttl: {LEADER_TTL}}}\n"
                f'writer: {{reconcile_interval: 5}}\ntraefik: {{api_url: "{traefik.api}"}}\n'
                # The backends' flaps are probed by whichever sidecar owns each server, decided by the leader.
                'health: {sharding: "on"}\n'
            )
            self.sidecars.append(Sidecar(f"sidecar-{n}", config, self.workdir / f"sidecar-{n}.log", links, self.command))
        for sidecar in self.sidecars:
            sidecar.start()
        await self.wait_ready(http, 60)

    async def wait_ready(self, http: aiohttp.ClientSession, timeout: float) -> None:
        """Until every sidecar answers /readyz 200 and exactly one leads."""
        deadline = time.monotonic() + timeout
        while True:
            ready = await self.readiness(http)
            if all(code == 200 for code in ready.values()) and sum((await self.leading(http)).values()) == 1:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"sidecars not ready in {timeout:.0f}s: {ready}; see {self.workdir}")
            await asyncio.sleep(0.2)

    async def readiness(self, http: aiohttp.ClientSession) -> dict[str, int]:
        """Each sidecar's /readyz status (0: no answer)."""
        out = {}
        for sidecar in self.sidecars:
            try:
                async with http.get(f"{sidecar.control}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    out[sidecar.name] = resp.status
            except (aiohttp.ClientError, TimeoutError):
                out[sidecar.name] = 0
        return out

    async def leading(self, http: aiohttp.ClientSession) -> dict[str, bool]:
        """Which sidecars say, through `exporter_leader`, that they lead."""
        out = {}
        for sidecar in self.sidecars:
            try:
                async with http.get(f"{sidecar.control}/metrics", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    out[sidecar.name] = "\nexporter_leader 1.0" in await resp.text()
            except (aiohttp.ClientError, TimeoutError):
                out[sidecar.name] = False
        return out

    async def leader(self, http: aiohttp.ClientSession) -> Sidecar | None:
        """The sidecar leading now, if one says so."""
        leading = await self.leading(http)
        return next((s for s in self.sidecars if leading.get(s.name)), None)

    async def gateway(self, http: aiohttp.ClientSession, path: str, body: dict[str, Any],
                      avoid: EmbeddedEtcd | None = None) -> dict[str, Any]:
        """One call to etcd's gateway through any member that answers (one may be down) but `avoid`, its JSON answer."""
        for _ in range(40):
            for member in self.members:
                if member.proc.poll() is not None or member is avoid:
                    continue
                try:
                    async with http.post(member.url + path, json=body, timeout=aiohttp.ClientTimeout(total=3)) as resp:
                        if resp.status < 500:  # answered (a compaction to a compacted revision is a 400)
                            answer: dict[str, Any] = await resp.json()
                            return answer
                except (aiohttp.ClientError, TimeoutError):
                    continue
            await asyncio.sleep(0.25)
        raise RuntimeError(f"no etcd member answered {path}")

    async def member_list(self, http: aiohttp.ClientSession, avoid: EmbeddedEtcd | None = None) -> list[dict[str, Any]]:
        """etcd's members as it lists them (ID, name, peerURLs)."""
        members: list[dict[str, Any]] = (await self.gateway(http, "/v3/cluster/member/list", {}, avoid))["members"]
        return members

    async def learn_member_ids(self, http: aiohttp.ClientSession) -> None:
        """Each member's raft id, found by the peer port it advertises (its link's)."""
        by_port = {int(m["peerURLs"][0].rsplit(":", 1)[1]): format(int(m["ID"]), "x") for m in await self.member_list(http)}
        self.member_ids = [by_port.get(link.port, "") for link in self.peer_links]

    async def replace_member(self, http: aiohttp.ClientSession, index: int) -> None:
        """As a StatefulSet roll with a lost volume does it: `member remove`, its data wiped, `member add`,
        and the member started again on the same ports with a fresh data dir, joining the existing cluster."""
        member, link = self.members[index], self.peer_links[index]
        await self.gateway(http, "/v3/cluster/member/remove", {"ID": str(int(self.member_ids[index], 16))}, avoid=member)
        await asyncio.to_thread(member.stop)
        data = member.args[member.args.index("--data-dir") + 1]
        await asyncio.to_thread(shutil.rmtree, data, True)
        added = await self.gateway(http, "/v3/cluster/member/add", {"peerURLs": [link.url]}, avoid=member)
        name = member.args[member.args.index("--name") + 1]
        cluster = ",".join(f"{m.get('name') or name}={m['peerURLs'][0]}" for m in added["members"])
        args = list(member.args)
        args[args.index("--initial-cluster") + 1] = cluster
        args[args.index("--initial-cluster-state") + 1] = "existing"
        member.args = args
        await asyncio.to_thread(member.restart, 60, "/version")
        await self.until_healthy(http, member)
        await self.learn_member_ids(http)

    async def until_healthy(self, http: aiohttp.ClientSession, member: EmbeddedEtcd, timeout: float = 60) -> None:
        """Wait for a joining member's /health; an alarm it raises on joining (the snapshot it was sent
        holds the pages a nospace fault freed, past the quota) is cleared as an operator does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (await self.gateway(http, "/v3/maintenance/alarm", {"action": "GET"})).get("alarms"):
                await self.defragment_and_disarm(http)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(member.url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"etcd member {member.client_port} not healthy {timeout}s after it joined; see {member.log}")

    async def defragment_and_disarm(self, http: aiohttp.ClientSession) -> float:
        """Defragment every running member, then disarm every alarm; returns the time just before the disarm."""
        for member in self.members:
            if member.proc.poll() is None:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.post(member.url + "/v3/maintenance/defragment", json={},
                                         timeout=aiohttp.ClientTimeout(total=30)) as resp:
                        await resp.read()
        disarmed = time.monotonic()
        alarms = await self.gateway(http, "/v3/maintenance/alarm", {"action": "GET"})
        for alarm in alarms.get("alarms", []):
            await self.gateway(http, "/v3/maintenance/alarm", {"action": "DEACTIVATE", "memberID": alarm["memberID"],
                                                              "alarm": alarm.get("alarm", "NOSPACE")})
        return disarmed

    def raft_leader(self) -> EmbeddedEtcd | None:
        """The etcd member that is the raft leader, if one answers."""
        try:
            return leader_of(self.members)
        except (AssertionError, OSError):
            return None

    async def stop(self) -> None:
        for sidecar in self.sidecars:
            await asyncio.to_thread(sidecar.stop)
            for link in sidecar.links:
                await link.close()
        for traefik in self.traefiks:
            await asyncio.to_thread(traefik.stop)
        for backend in self.backends:
            await backend.stop()
        for member in self.members:
            await asyncio.to_thread(member.stop)
        for link in self.peer_links:
            await link.close()
