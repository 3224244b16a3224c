"""The faults of a campaign, drawn at random from a seed and overlapping.

Each fault acts, holds for a drawn time (or until the campaign ends) and heals. They overlap
within bounds that keep the system able to make progress: at most one etcd member impaired (a
quorum stays), at most two of the three sidecars impaired at once, one fault at a time per
Traefik, per backend, per foreign key and for the database quota. The faults of the links and of
etcd's disk and membership are in link_faults.py and etcd_faults.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import aiohttp

from exporter.etcd.types import b64

from . import etcd_faults, link_faults
from .history import Fault
from .recorder import Recorder
from .world import LEADER_TTL, ROOT, Sidecar, World

FOREIGN_DECODABLE = f"{ROOT}/http/middlewares/campaign-foreign/headers/customResponseHeaders/X-Foreign"
FOREIGN_FREEZING = f"{ROOT}/http/routers/campaign-foreign/priority"

# How often each kind is drawn, relative to the others: the crash faults give some of their time
# to the faults of links, disks and membership.
WEIGHTS = {
    "sidecar-kill": 1.0, "leader-stop": 1.0, "etcd-kill": 0.7, "traefik-restart": 0.5, "foreign-key": 0.4,
    "freezing-key": 0.4, "compaction": 0.5, "backend-flap": 1.0, "partition": 1.5, "reset": 0.6, "member-cut": 1.2,
    "leader-isolate": 0.8, "latency": 1.2, "nospace": 0.4, "member-replace": 0.4,
}
KINDS = tuple(WEIGHTS)


class Faults:
    """Draws faults of `kinds` until the workload stops; `done` lists them."""

    def __init__(self, world: World, http: aiohttp.ClientSession, recorder: Recorder, seed: int, started: float,
                 kinds: tuple[str, ...] = KINDS) -> None:
        self.world, self.http, self.recorder = world, http, recorder
        self.rng = random.Random(seed)
        self.started = started
        self.kinds = kinds
        self.done: list[Fault] = []
        self.counts: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()  # drawn while its target was impaired already
        self.ending = asyncio.Event()
        self.sidecars = asyncio.Semaphore(2)
        self.member = asyncio.Lock()  # one etcd member impaired at a time
        self.busy: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []

    def now(self) -> float:
        return time.monotonic() - self.started

    async def run(self, mean_gap: float) -> None:
        """Start a fault every `mean_gap` seconds on average until `heal` is called."""
        acts: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            "sidecar-kill": self._sidecar_kill, "leader-stop": self._leader_stop,
            "etcd-kill": lambda: etcd_faults.etcd_kill(self), "traefik-restart": self._traefik_restart,
            "foreign-key": self._foreign_key, "freezing-key": self._freezing_key,
            "compaction": lambda: etcd_faults.compaction(self), "backend-flap": self._backend_flap,
            "partition": lambda: link_faults.partition(self), "reset": lambda: link_faults.reset(self),
            "member-cut": lambda: link_faults.member_cut(self),
            "leader-isolate": lambda: link_faults.leader_isolate(self), "latency": lambda: link_faults.latency(self),
            "nospace": lambda: etcd_faults.nospace(self), "member-replace": lambda: etcd_faults.member_replace(self),
        }
        weights = [WEIGHTS[kind] for kind in self.kinds]
        while not self.ending.is_set():
            await self.hold(self.rng.expovariate(1 / mean_gap))
            if not self.ending.is_set():
                self._tasks.append(asyncio.create_task(acts[self.rng.choices(self.kinds, weights)[0]]()))

    async def heal(self) -> None:
        """Stop drawing; every running fault heals now."""
        self.ending.set()
        await asyncio.gather(*self._tasks)

    async def hold(self, seconds: float) -> None:
        """Sleep `seconds`, or less once the campaign ends."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ending.wait(), seconds)

    async def record(self, kind: str, target: str, start: float, mode: str = "", end: float | None = None,
                     start_revision: int = 0) -> None:
        """A fault healed (at `end`, default now), and etcd's revision once it had (what the sidecars must catch up to)."""
        end = self.now() if end is None else end
        self.done.append(Fault(kind, target, start, end, mode, await self.revision(), start_revision))
        self.counts[kind] += 1

    async def revision(self) -> int:
        """etcd's revision now (0: no member answered)."""
        try:
            answer = await self.world.gateway(self.http, "/v3/kv/range", {"key": b64("campaign/marker")})
        except RuntimeError:
            return 0
        return int(answer.get("header", {}).get("revision", 0))

    async def pick_sidecar(self, leader_half: bool = True) -> Sidecar | None:
        """The leader half the time, else any; None when that one is impaired already."""
        leader = await self.world.leader(self.http) if leader_half and self.rng.random() < 0.5 else None
        sidecar = leader or self.rng.choice(self.world.sidecars)
        return None if sidecar.name in self.busy else sidecar

    async def on_sidecar(self, kind: str, sidecar: Sidecar | None, act: Callable[[Sidecar], Awaitable[None]],
                         undo: Callable[[Sidecar], Awaitable[None]], seconds: float, mode: str = "") -> None:
        """`act` on `sidecar`, hold, `undo`: within the bound of two sidecars impaired at once."""
        if sidecar is None or self.sidecars.locked():
            self.skipped[kind] += 1
            return
        async with self.sidecars:
            self.busy.add(sidecar.name)
            start = self.now()
            try:
                await act(sidecar)
                start = self.now()  # once in effect: what a sidecar answers from now on is judged under it
                await self.hold(seconds)
            finally:
                await undo(sidecar)
                self.busy.discard(sidecar.name)
                await self.record(kind, sidecar.name, start, mode)

    async def _sidecar_kill(self) -> None:
        async def kill(s: Sidecar) -> None:
            await asyncio.to_thread(s.kill)

        async def restart(s: Sidecar) -> None:
            s.start()

        await self.on_sidecar("sidecar-kill", await self.pick_sidecar(), kill, restart, self.rng.uniform(0.5, 5))

    async def _leader_stop(self) -> None:
        async def stop(s: Sidecar) -> None:
            s.signal(signal.SIGSTOP)

        async def cont(s: Sidecar) -> None:
            s.signal(signal.SIGCONT)

        leader = await self.world.leader(self.http)
        await self.on_sidecar("leader-stop", leader if leader and leader.name not in self.busy else None, stop, cont,
                               self.rng.uniform(LEADER_TTL + 1, LEADER_TTL + 4))

    async def exclusive(self, kind: str, target: str, act: Callable[[], Awaitable[None]], undo: Callable[[], Awaitable[None]],
                         seconds: float) -> None:
        if target in self.busy:
            self.skipped[kind] += 1
            return
        self.busy.add(target)
        start = self.now()
        try:
            await act()
            await self.hold(seconds)
        finally:
            await undo()
            self.busy.discard(target)
            await self.record(kind, target, start)

    async def _traefik_restart(self) -> None:
        traefik = self.rng.choice(self.world.traefiks)

        async def stop() -> None:
            await asyncio.to_thread(traefik.stop)

        async def start() -> None:
            await asyncio.to_thread(traefik.start)

        await self.exclusive("traefik-restart", traefik.name, stop, start, self.rng.uniform(0, 2))

    async def _backend_flap(self) -> None:
        if any(b.name in self.busy for b in self.world.backends):
            self.skipped["backend-flap"] += 1  # one down at a time: every ingress keeps a server
            return
        backend = self.rng.choice(self.world.backends)
        async def start() -> None:
            await backend.start()

        await self.exclusive("backend-flap", backend.name, backend.stop, start, self.rng.uniform(1, 6))

    async def _foreign_key(self) -> None:
        await self.exclusive("foreign-key", FOREIGN_DECODABLE, lambda: self._put(FOREIGN_DECODABLE, "yes"),
                              lambda: self._delete(FOREIGN_DECODABLE), self.rng.uniform(1, 8))

    async def _freezing_key(self) -> None:
        await self.exclusive("freezing-key", FOREIGN_FREEZING, lambda: self._put(FOREIGN_FREEZING, "abc"),
                              lambda: self._delete(FOREIGN_FREEZING), self.rng.uniform(0.5, 4))

    async def _put(self, key: str, value: str) -> None:
        await self.world.gateway(self.http, "/v3/kv/put", {"key": b64(key), "value": b64(value)})

    async def _delete(self, key: str) -> None:
        await self.world.gateway(self.http, "/v3/kv/deleterange", {"key": b64(key)})
