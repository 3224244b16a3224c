"""What a campaign looks at once the faults have healed: the stored records, each root's `diff`,
what each Traefik serves, each sidecar's readiness and leadership; and, while the faults run,
each sidecar's `/v1/mirror`, held afterwards to etcd read at each sample's revision."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from exporter.etcd.types import b64, b64_range_end, unb64

from .checker import History, Look, Stored, Violation, ready_and_one_leader, served_exactly
from .history import content_of
from .world import AUTHORITIES, RECORDS, World, root_of


@dataclass
class Observation:
    """One look at the end state."""

    final: dict[str, Stored] = field(default_factory=dict)
    diff_exit: dict[str, int] = field(default_factory=dict)
    diff_output: str = ""
    served: dict[str, dict[str, tuple[int, str]]] = field(default_factory=dict)
    ready: dict[str, int] = field(default_factory=dict)
    leading: dict[str, bool] = field(default_factory=dict)

    def violations(self) -> list[Violation]:
        """Rules 4 to 6 on this look alone (what the end waits for)."""
        history = History(final=self.final, diff_exit=self.diff_exit, served=self.served)
        diff = [Violation(4, roots, f"diff exited {code}") for roots, code in self.diff_exit.items() if code != 0]
        return [*diff, *served_exactly(history), *ready_and_one_leader(self.ready, self.leading)]


async def stored_records(http: aiohttp.ClientSession, world: World) -> dict[str, Stored]:
    """Every record in etcd, as the checker reads it."""
    prefix = RECORDS + "/"
    names = {f"127.0.0.1:{b.port}": b.name for b in world.backends}
    answer = await world.gateway(http, "/v3/kv/range", {"key": b64(prefix), "range_end": b64_range_end(prefix)})
    out = {}
    for kv in answer.get("kvs", []):
        record = json.loads(unb64(kv.get("value")))
        ingress = record["ingress"]
        urls = [s["url"] for s in ingress.get("upstream", {}).get("servers", [])]
        out[unb64(kv["key"])[len(prefix):]] = Stored(
            ingress["revision"], bool(record.get("removed")), served=ingress["authority"] == AUTHORITIES[0],
            bodies=frozenset(names.get(url.removeprefix("http://"), url) for url in urls), content=content_of(ingress),
        )
    return out


async def run_diff(workdir: Path, world: World) -> tuple[int, str]:
    """`traefik-etcd-exporter diff` on every root, straight to the members."""
    config = workdir / "diff.yaml"
    endpoints = ", ".join(f'"{url}"' for url in world.endpoints)
    config.write_text(f"etcd: {{endpoints: [{endpoints}]}}\n")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "exporter", "diff", "--config", str(config), "--no-color",
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace")


async def served_hosts(http: aiohttp.ClientSession, world: World, hosts: list[str]) -> dict[str, dict[str, tuple[int, str]]]:
    """What each Traefik answers for each host."""
    out: dict[str, dict[str, tuple[int, str]]] = {}
    for traefik in world.traefiks:
        answers = {}
        for host in hosts:
            try:
                async with http.get(traefik.web + "/", headers={"Host": host}, timeout=aiohttp.ClientTimeout(total=3)) as resp:
                    answers[host] = (resp.status, await resp.text())
            except (aiohttp.ClientError, TimeoutError):
                answers[host] = (0, "")
        out[traefik.name] = answers
    return out


async def observe(http: aiohttp.ClientSession, world: World, workdir: Path) -> Observation:
    """One look at everything the end rules read."""
    final = await stored_records(http, world)
    code, output = await run_diff(workdir, world)
    hosts = [f"{name.rsplit('/', 1)[1]}.test" for name, stored in final.items() if stored.served]
    return Observation(
        final=final, diff_exit={"+".join(root_of(a) for a in AUTHORITIES): code}, diff_output=output,
        served=await served_hosts(http, world, hosts), ready=await world.readiness(http), leading=await world.leading(http),
    )


async def etcd_diverged(http: aiohttp.ClientSession, world: World, revision: int, timeout: float = 30) -> list[str]:
    """Members that do not hold the same data at `revision` (empty: etcd stayed consistent).

    Each member, read alone (serializable), must reach `revision` and hold the same keyspace
    there (every key, value and mod revision; etcd's HashKV is not on its gateway): a member
    that skipped writes it acknowledged through raft (etcd 3.5.0-3.5.2 after a SIGKILL under
    load) never gets there, or holds other data.
    """
    hashes: dict[str, str] = {}
    problems = []
    for member in world.members:
        name = f"member {member.client_port}"
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            async with http.post(member.url + "/v3/kv/range", json={"key": b64("\0"), "keys_only": True, "limit": "1",
                                                                   "serializable": True}) as resp:
                at = int((await resp.json())["header"]["revision"])
            if at >= revision or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.2)
        if at < revision:
            problems.append(f"{name} is at revision {at}, the cluster at {revision}")
            continue
        body = {"key": b64("\0"), "range_end": b64("\0"), "revision": str(revision), "serializable": True}
        async with http.post(member.url + "/v3/kv/range", json=body) as resp:
            kvs = (await resp.json()).get("kvs", [])
        digest = hashlib.sha256()
        for kv in sorted(kvs, key=lambda kv: kv["key"]):
            digest.update(f"{kv['key']} {kv['mod_revision']} {kv.get('value', '')}\n".encode())
        hashes[name] = digest.hexdigest()[:16]
    if len(set(hashes.values())) > 1:
        problems.append(f"the keyspaces at revision {revision} differ: {hashes}")
    return problems


async def sample_mirrors(
    http: aiohttp.ClientSession, world: World, samples: list[tuple[str, int, str, str]], stop: asyncio.Event
) -> None:
    """Each live sidecar's `/v1/mirror` every second while the faults run, each with etcd read at its revision at once
    (the compaction fault would erase it later); a sample whose revision is compacted before the read is left out."""
    read: dict[tuple[int, tuple[str, ...]], str | None] = {}
    while not stop.is_set():
        for sidecar in world.sidecars:
            try:
                async with http.get(f"{sidecar.control}/v1/mirror", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status != 200:
                        continue
                    found: dict[str, Any] = await resp.json()
            except (aiohttp.ClientError, TimeoutError):
                continue  # down or stopped by a fault: nothing to sample
            revision, prefixes = int(found["revision"]), tuple(str(p) for p in found["prefixes"])
            if not revision:
                continue
            if (revision, prefixes) not in read:
                read[(revision, prefixes)] = await etcd_digest(http, world, revision, prefixes)
            if (etcd := read[(revision, prefixes)]) is not None:
                samples.append((sidecar.name, revision, str(found["digest"]), etcd))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def etcd_digest(http: aiohttp.ClientSession, world: World, revision: int, prefixes: tuple[str, ...]) -> str | None:
    """The digest of etcd read at `revision` under `prefixes` (docs/operations.md, `GET /v1/mirror`); None: compacted."""
    kvs = []
    for prefix in prefixes:
        body = {"key": b64(prefix), "range_end": b64_range_end(prefix), "revision": str(revision)}
        answer = await world.gateway(http, "/v3/kv/range", body)
        if "header" not in answer:
            return None  # an error: the revision was compacted meanwhile
        kvs += answer.get("kvs", [])
    digest = hashlib.sha256()
    for kv in sorted(kvs, key=lambda kv: base64.b64decode(kv["key"])):
        digest.update(base64.b64decode(kv["key"]) + b"\0" + base64.b64decode(kv.get("value", "")) + b"\0"
                      + str(kv["mod_revision"]).encode() + b"\n")
    return digest.hexdigest()


async def sample_looks(http: aiohttp.ClientSession, world: World, started: float, looks: list[Look], prefixes: list[str],
                       stop: asyncio.Event) -> None:
    """Each sidecar's /readyz and /v1/mirror revision every half second while the faults run (rules 10
    and 12); `prefixes` gets the mirror's."""
    while not stop.is_set():
        for sidecar in world.sidecars:
            ready, reasons, revision = 0, "", 0
            try:
                async with http.get(f"{sidecar.control}/readyz", timeout=aiohttp.ClientTimeout(total=1)) as resp:
                    ready, reasons = resp.status, " ".join((await resp.json()).get("reasons", []))
                async with http.get(f"{sidecar.control}/v1/mirror", timeout=aiohttp.ClientTimeout(total=1)) as resp:
                    if resp.status == 200:
                        found = await resp.json()
                        revision = int(found["revision"])
                        prefixes[:] = prefixes or [str(p) for p in found["prefixes"]]
            except (aiohttp.ClientError, TimeoutError, ValueError):
                pass  # down or stopped by a fault: what was seen is kept
            looks.append(Look(time.monotonic() - started, sidecar.name, ready, reasons, revision))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
