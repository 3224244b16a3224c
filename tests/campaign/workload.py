"""The coordinator clients of a campaign: upserts and removes of a bounded set of ingresses, every
request and answer recorded with its times.

Each request draws a new revision for its ingress from one counter, so a stored revision names
the request that wrote it. Besides plain upserts and removes a client sometimes sends a stale
revision with other content, retries a request that timed out (the same body, another sidecar),
sends one request to two sidecars at once, and removes without a revision. An upsert carries
one of a few sets of edge fields, or its own allowlist, or none: the shared objects they render
to are created, named by several routers, left and deleted while the faults run.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp

from .checker import Request
from .history import content_of
from .world import AUTHORITIES, TOKEN, Sidecar, World

HEADERS = {"Authorization": f"Bearer {TOKEN}"}
HEALTH = {"enable": True, "interval": 0.5, "max_retries": 2, "max_wait_time": 0.5, "initial_delay": 0}
# Edge fields an upsert may carry, each letting the campaign's requests through (loopback clients, no 429 at its pace).
EDGES: list[dict[str, Any]] = [
    {},
    {"allowed_client_ips": ["127.0.0.0/8"], "limits": {"max_in_flight": 64}, "retry": {"attempts": 2}, "timeouts": {"dial": 5}},
    {"allowed_client_ips": ["127.0.0.1/32", "10.0.0.0/8"], "limits": {"max_body_bytes": 1048576, "rate": {"average": 1000, "burst": 1000}},
     "timeouts": {"response_header": 30}, "keepalive": False},
]


@dataclass(frozen=True)
class Item:
    """One ingress of a request: its name, the revision it carries (None: a remove without one), its body."""

    ingress: str
    revision: int | None
    body: dict[str, Any]


def ingress_names(count: int) -> list[str]:
    """`<authority>/<id>` of the bounded set: most on the sidecars' root, a fifth on the second one."""
    return [f"{AUTHORITIES[0] if n % 5 else AUTHORITIES[1]}/i{n}" for n in range(count)]


class Workload:
    """Clients pushing to the world's sidecars until stopped; `requests` is the recorded history."""

    def __init__(self, world: World, http: aiohttp.ClientSession, ingresses: int, seed: int) -> None:
        self.world, self.http = world, http
        self.names = ingress_names(ingresses)
        self.revisions: Counter[str] = Counter()
        self.requests: list[Request] = []
        self.kinds: Counter[str] = Counter()
        self.seed = seed
        self.calls = 0
        self.started = time.monotonic()
        self._stop = asyncio.Event()

    def now(self) -> float:
        return time.monotonic() - self.started

    def stop(self) -> None:
        self._stop.set()

    async def run(self, clients: int) -> None:
        await asyncio.gather(*(self._client(f"client-{n}", random.Random(self.seed * 1000 + n)) for n in range(clients)))

    def _next(self, ingress: str) -> int:
        self.revisions[ingress] += 1
        return self.revisions[ingress]

    def _upsert(self, rng: random.Random, ingress: str, revision: int) -> Item:
        authority, iid = ingress.split("/")
        servers = rng.sample(self.world.backends, rng.choice((1, 2)))
        body = {"authority": authority, "id": iid, "revision": revision, "hosts": [f"{iid}.test"],
                "upstream": {"servers": [{"url": b.url} for b in servers]}, "health_check": HEALTH}
        edge = rng.randrange(len(EDGES) + 1)
        # The last choice: an allowlist of the ingress's own (a shared object only it names).
        body.update(EDGES[edge] if edge < len(EDGES) else {"allowed_client_ips": ["127.0.0.0/8", f"10.{int(iid[1:]) % 250}.0.0/16"]})
        return Item(ingress, revision, body)

    def _remove(self, ingress: str, revision: int | None) -> Item:
        authority, iid = ingress.split("/")
        body: dict[str, Any] = {"authority": authority, "id": iid}
        if revision is not None:
            body["revision"] = revision
        return Item(ingress, revision, body)

    async def _client(self, name: str, rng: random.Random) -> None:
        while not self._stop.is_set():
            kind = rng.choices(("upsert", "batch", "remove", "stale", "twice", "bare-remove"), (50, 10, 12, 10, 10, 3))[0]
            self.kinds[kind] += 1
            ingress = rng.choice(self.names)
            if kind == "batch":
                items = [self._upsert(rng, i, self._next(i)) for i in rng.sample(self.names, rng.randint(2, 4))]
                await self._send(name, rng, "upsert", items, retry=True)
            elif kind == "remove":
                await self._send(name, rng, "remove", [self._remove(ingress, self._next(ingress))], retry=True)
            elif kind == "bare-remove":
                await self._send(name, rng, "remove", [self._remove(ingress, None)], retry=True)
            elif kind == "stale":
                # An older revision with other content: refused, unless it was never stored.
                revision = max(1, self.revisions[ingress] - rng.randint(0, 3))
                await self._send(name, rng, "upsert", [self._upsert(rng, ingress, revision)], retry=False)
            elif kind == "twice":
                items = [self._upsert(rng, ingress, self._next(ingress))]
                first, second = rng.sample(self.world.sidecars, 2)
                await asyncio.gather(self._one(name, "upsert", items, first, 10.0), self._one(name, "upsert", items, second, 10.0))
            else:
                await self._send(name, rng, "upsert", [self._upsert(rng, ingress, self._next(ingress))], retry=True)

    async def _send(self, name: str, rng: random.Random, op: str, items: list[Item], retry: bool) -> None:
        """Send to a random sidecar; one in five with a short timeout; a request without an answer
        is sent again (the same body) to another sidecar, up to three times in all."""
        for _ in range(3):
            sidecar = rng.choice(self.world.sidecars)
            timeout = rng.choice((0.3, 10.0, 10.0, 10.0, 10.0))
            status = await self._one(name, op, items, sidecar, timeout)
            if status != 0 or not retry:
                return

    async def _one(self, name: str, op: str, items: list[Item], sidecar: Sidecar, timeout: float) -> int:
        invoked = self.now()
        status, refused_by = 0, None
        try:
            async with self.http.post(f"{sidecar.api}/v2/ingress/{op}", json={"ingresses": [i.body for i in items]}, headers=HEADERS,
                                      timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                body = await resp.read()
                status = resp.status
            if status == 409:
                refused_by = json.loads(body)["data"]["stored_revision"]
        except (aiohttp.ClientError, TimeoutError):
            await asyncio.sleep(0.05)  # a refused connection answers at once: don't spin on a dead sidecar
        completed = self.now()
        self.calls += 1
        self.requests.extend(Request(name, op, i.ingress, i.revision, invoked, completed, status, self.calls, refused_by, sidecar.name,
                                     content_of(i.body) if op == "upsert" else "")
                             for i in items)
        return status
