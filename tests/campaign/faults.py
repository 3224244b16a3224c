"""The faults of a campaign, drawn at random from a seed and overlapping.

Each fault acts, holds for a drawn time (or until the campaign ends) and heals. They overlap
within bounds that keep the system able to make progress: at most one etcd member down (a
quorum stays), at most two of the three sidecars impaired at once, one fault at a time per
Traefik, per backend and per foreign key.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp

from exporter.etcd.types import b64

from .recorder import Recorder
from .world import LEADER_TTL, ROOT, Sidecar, World

FOREIGN_DECODABLE = f"{ROOT}/http/middlewares/campaign-foreign/headers/customResponseHeaders/X-Foreign"
FOREIGN_FREEZING = f"{ROOT}/http/routers/campaign-foreign/priority"


@dataclass(frozen=True)
class Fault:
    """One fault as it happened: what, on whom, from when to when (seconds into the run)."""

    kind: str
    target: str
    start: float
    end: float


class Faults:
    """Draws faults until the workload stops; `done` lists them."""

    KINDS = ("sidecar-kill", "leader-stop", "etcd-kill", "traefik-restart", "foreign-key", "freezing-key",
             "compaction", "backend-flap", "partition")

    def __init__(self, world: World, http: aiohttp.ClientSession, recorder: Recorder, seed: int, started: float) -> None:
        self.world, self.http, self.recorder = world, http, recorder
        self.rng = random.Random(seed)
        self.started = started
        self.done: list[Fault] = []
        self.counts: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()  # drawn while its target was impaired already
        self.ending = asyncio.Event()
        self._sidecars = asyncio.Semaphore(2)
        self._member = asyncio.Lock()
        self._busy: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []

    def now(self) -> float:
        return time.monotonic() - self.started

    async def run(self, mean_gap: float) -> None:
        """Start a fault every `mean_gap` seconds on average until `heal` is called."""
        acts: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            "sidecar-kill": self._sidecar_kill, "leader-stop": self._leader_stop, "etcd-kill": self._etcd_kill,
            "traefik-restart": self._traefik_restart, "foreign-key": self._foreign_key, "freezing-key": self._freezing_key,
            "compaction": self._compaction, "backend-flap": self._backend_flap, "partition": self._partition,
        }
        while not self.ending.is_set():
            await self._hold(self.rng.expovariate(1 / mean_gap))
            if not self.ending.is_set():
                self._tasks.append(asyncio.create_task(acts[self.rng.choice(self.KINDS)]()))

    async def heal(self) -> None:
        """Stop drawing; every running fault heals now."""
        self.ending.set()
        await asyncio.gather(*self._tasks)

    async def _hold(self, seconds: float) -> None:
        """Sleep `seconds`, or less once the campaign ends."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ending.wait(), seconds)

    def _record(self, kind: str, target: str, start: float) -> None:
        self.done.append(Fault(kind, target, start, self.now()))
        self.counts[kind] += 1

    async def _pick_sidecar(self, leader_half: bool = True) -> Sidecar | None:
        """The leader half the time, else any; None when that one is impaired already."""
        leader = await self.world.leader(self.http) if leader_half and self.rng.random() < 0.5 else None
        sidecar = leader or self.rng.choice(self.world.sidecars)
        return None if sidecar.name in self._busy else sidecar

    async def _on_sidecar(self, kind: str, sidecar: Sidecar | None, act: Callable[[Sidecar], Awaitable[None]],
                          undo: Callable[[Sidecar], Awaitable[None]], seconds: float) -> None:
        if sidecar is None or self._sidecars.locked():
            self.skipped[kind] += 1
            return
        async with self._sidecars:
            self._busy.add(sidecar.name)
            start = self.now()
            try:
                await act(sidecar)
                await self._hold(seconds)
            finally:
                await undo(sidecar)
                self._busy.discard(sidecar.name)
                self._record(kind, sidecar.name, start)

    async def _sidecar_kill(self) -> None:
        async def kill(s: Sidecar) -> None:
            await asyncio.to_thread(s.kill)

        async def restart(s: Sidecar) -> None:
            s.start()

        await self._on_sidecar("sidecar-kill", await self._pick_sidecar(), kill, restart, self.rng.uniform(0.5, 5))

    async def _leader_stop(self) -> None:
        async def stop(s: Sidecar) -> None:
            s.signal(signal.SIGSTOP)

        async def cont(s: Sidecar) -> None:
            s.signal(signal.SIGCONT)

        leader = await self.world.leader(self.http)
        await self._on_sidecar("leader-stop", leader if leader and leader.name not in self._busy else None, stop, cont,
                               self.rng.uniform(LEADER_TTL + 1, LEADER_TTL + 4))

    async def _partition(self) -> None:
        async def cut(s: Sidecar) -> None:
            for link in s.links:
                link.partition()

        async def heal(s: Sidecar) -> None:
            for link in s.links:
                link.heal()

        await self._on_sidecar("partition", await self._pick_sidecar(), cut, heal, self.rng.uniform(1, LEADER_TTL + 4))

    async def _etcd_kill(self) -> None:
        if self._member.locked():
            self.skipped["etcd-kill"] += 1
            return
        async with self._member:
            leader = self.world.raft_leader() if self.rng.random() < 0.5 else None
            member = leader or self.rng.choice(self.world.members)
            name = f"{'raft leader ' if leader else ''}{member.client_port}"
            start = self.now()
            member.proc.kill()
            await asyncio.to_thread(member.proc.wait)
            try:
                await self._hold(self.rng.uniform(0.5, 5))
            finally:
                await asyncio.to_thread(member.restart)
                self._record("etcd-kill", name, start)

    async def _exclusive(self, kind: str, target: str, act: Callable[[], Awaitable[None]], undo: Callable[[], Awaitable[None]],
                         seconds: float) -> None:
        if target in self._busy:
            self.skipped[kind] += 1
            return
        self._busy.add(target)
        start = self.now()
        try:
            await act()
            await self._hold(seconds)
        finally:
            await undo()
            self._busy.discard(target)
            self._record(kind, target, start)

    async def _traefik_restart(self) -> None:
        traefik = self.rng.choice(self.world.traefiks)

        async def stop() -> None:
            await asyncio.to_thread(traefik.stop)

        async def start() -> None:
            await asyncio.to_thread(traefik.start)

        await self._exclusive("traefik-restart", traefik.name, stop, start, self.rng.uniform(0, 2))

    async def _backend_flap(self) -> None:
        if any(b.name in self._busy for b in self.world.backends):
            self.skipped["backend-flap"] += 1  # one down at a time: every ingress keeps a server
            return
        backend = self.rng.choice(self.world.backends)
        async def start() -> None:
            await backend.start()

        await self._exclusive("backend-flap", backend.name, backend.stop, start, self.rng.uniform(1, 6))

    async def _foreign_key(self) -> None:
        await self._exclusive("foreign-key", FOREIGN_DECODABLE, lambda: self._put(FOREIGN_DECODABLE, "yes"),
                              lambda: self._delete(FOREIGN_DECODABLE), self.rng.uniform(1, 8))

    async def _freezing_key(self) -> None:
        await self._exclusive("freezing-key", FOREIGN_FREEZING, lambda: self._put(FOREIGN_FREEZING, "abc"),
                              lambda: self._delete(FOREIGN_FREEZING), self.rng.uniform(0.5, 4))

    async def _compaction(self) -> None:
        # Up to what the recorder has read: the history stays whole.
        start = self.now()
        await self.world.gateway(self.http, "/v3/kv/compaction", {"revision": str(self.recorder.seen)})
        self._record("compaction", str(self.recorder.seen), start)

    async def _put(self, key: str, value: str) -> None:
        await self.world.gateway(self.http, "/v3/kv/put", {"key": b64(key), "value": b64(value)})

    async def _delete(self, key: str) -> None:
        await self.world.gateway(self.http, "/v3/kv/deleterange", {"key": b64(key)})
