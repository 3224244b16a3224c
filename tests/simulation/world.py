"""One seeded run: two or three reconcilers on the scheduled etcd, every outcome a step, the invariants after each.

A run draws its steps from one random source: a request to a sidecar (the campaign's mix:
new, stale, duplicate and remove requests, with shared edge objects), a watch message (one to
three whole revisions), an answer to a transaction or a read, a reply lost after the
transaction committed, a failed call, a peer's write, a broken stream, a compaction, a
listing asked for, a lease that expires and moves leadership (leadership.py), a deposed leader
noticing, a server ejected or returned (health.py), time passing. Then the faults and the
requests stop, and every sidecar must converge within a bounded number of steps, to routing
that follows the verdicts.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.errors import ExporterError
from exporter.etcd.types import Compare, Op, TxnResult
from exporter.keys import IngressRef, KeyLayout
from exporter.plan.plan import Plan
from exporter.plan.planner import Planner
from exporter.reconcile import Cadence, Collaborators, Reconciler, TxnLimits
from exporter.render.renderer import Renderer
from exporter.roles import Ejections
from exporter.store.observed import Observed
from exporter.store.records import Record, Removal, decode_record
from tests.fake_reconciler import CERT
from tests.helpers import AUTHORITY, HookedEtcd, record
from tests.replay import dangling

from .etcd import Call, SimEtcd
from .health import SERVERS, Verdicts
from .leadership import Election

LAYOUT = KeyLayout("traefik/worker_{authority}", "records")
ROOT = LAYOUT.root(AUTHORITY)
PREFIXES = (LAYOUT.roots_prefix, LAYOUT.records_dir)
# Steps with faults and requests, then steps to converge in.
STEPS = 120
SETTLE_STEPS = 400
INGRESSES = 4
EDGES: list[dict[str, Any]] = [{}, {"allowed_client_ips": ["10.0.0.0/8"]}, {"allowed_client_ips": ["10.0.0.0/8", "192.168.0.0/16"]}]


class Failure(Exception):
    """An invariant broke: which one, at which step, and what was seen."""

    def __init__(self, invariant: str, step: int, detail: str) -> None:
        super().__init__(f"{invariant} at step {step}: {detail}")
        self.invariant, self.step, self.detail = invariant, step, detail


class CheckedPlanner(Planner):
    """The planner, noting any ingress planned against a mirror older than a commit of it this sidecar made."""

    def __init__(self, sim: Simulation, index: int) -> None:
        super().__init__(Renderer(LAYOUT, ["web"]), LAYOUT, CERT)
        self._sim, self._index = sim, index

    def plan(self, desired: Mapping[IngressRef, Record], observed: Observed, owners: Iterable[IngressRef] | None = None,
             ejections: Ejections | None = None, include_roots: bool = True) -> Plan:
        mine = self._sim.commits[self._index]
        for ref in owners if owners is not None else desired:
            if mine.get(ref, 0) > observed.revision:
                detail = f"sidecar {self._index} planned {ref} at R={observed.revision}, its commit is {mine[ref]}"
                self._sim.violations.append(("planned before its commit", detail))
        if ejections is None:
            return super().plan(desired, observed, owners, include_roots=include_roots)
        return super().plan(desired, observed, owners, ejections, include_roots)


class Client(HookedEtcd):
    """One sidecar's view of the scheduled etcd: its transactions are known as its own."""

    def __init__(self, etcd: SimEtcd, index: int) -> None:
        super().__init__(etcd)
        self._etcd, self.index = etcd, index

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        return await self._etcd.txn(compares, ops, owner=self.index)


@dataclass
class Sidecar:
    """A reconciler and where its mirror was last seen: (generation, revision)."""

    rec: Reconciler
    seen: tuple[int, int] = (0, 0)


@dataclass
class Simulation:
    """The world of one seed."""

    seed: int
    rng: random.Random = field(init=False)
    etcd: SimEtcd = field(init=False)
    sidecars: list[Sidecar] = field(default_factory=list)
    # Per sidecar, the revision of its newest commit of each ingress whose reply it got.
    commits: list[dict[IngressRef, int]] = field(default_factory=list)
    violations: list[tuple[str, str]] = field(default_factory=list)
    # The strongest (revision, removed) acknowledged for each ingress.
    acked: dict[IngressRef, tuple[int, bool]] = field(default_factory=dict)
    issued: dict[str, int] = field(default_factory=dict)
    sent: list[tuple[list[Record], list[Removal]]] = field(default_factory=list)
    requests: list[asyncio.Task[None]] = field(default_factory=list)
    checked_revision: int = 0
    election: Election = field(init=False)
    verdicts: Verdicts = field(default_factory=Verdicts)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.etcd = SimEtcd(max_txn_ops=8, prefixes=PREFIXES)

    async def run(self) -> None:
        """The run: raises Failure naming the invariant and the step."""
        count = self.rng.choice((2, 3))
        self.election = Election(self.etcd, count)
        await self.election.elect(0)
        for index in range(count):
            self.commits.append({})
            rec = Reconciler(
                etcd=Client(self.etcd, index), layout=LAYOUT, planner=CheckedPlanner(self, index),
                shared=Collaborators(leader=self.election.leaders[index], ejections=self.verdicts),
                cadence=Cadence(coalesce_window=0.02, reconcile_interval=5.0), limits=TxnLimits(max_ops=4, max_bytes=1 << 20),
            )
            self.election.watch_own_units(rec, index)
            await rec.start()
            self.sidecars.append(Sidecar(rec))
        try:
            for step in range(STEPS):
                await self.step(faults=True)
                self.check(step)
            for index in sorted(self.election.unaware):  # their leases are long gone: every deposed leader has noticed
                self.election.notice(index)
            for step in range(STEPS, STEPS + SETTLE_STEPS):
                await self.step(faults=False)
                self.check(step)
                if self.converged():
                    if wrong := self.verdicts.misrouted(self.etcd.keys(), ROOT, LAYOUT.records_dir):
                        raise Failure("routing follows the verdicts", step, wrong)
                    return
            raise Failure("converge", STEPS + SETTLE_STEPS, f"not converged: {self.unconverged()}")
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Cancel everything still running (nothing outlives its seed)."""
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ----- steps

    async def step(self, *, faults: bool) -> None:
        """Draw one step and let every task run until it waits again."""
        etcd, rng = self.etcd, self.rng
        streams = [s for s in etcd.streams if etcd.undelivered(s, 1)]
        choices: list[tuple[float, str]] = [(1.0, "time")]
        if streams:
            choices.append((4.0, "deliver"))
        if etcd.calls:
            choices.append((6.0, "answer"))
        if faults:
            choices += [(3.0, "request"), (0.6, "peer"), (0.2, "relist"), (0.25, "expire"), (0.4, "health")]
            if self.election.unaware:
                choices.append((0.4, "notice"))
            if etcd.calls:
                choices += [(0.4, "lost"), (0.5, "fail")]
            if etcd.streams:
                choices += [(0.3, "break"), (0.15, "compact")]
        kind = rng.choices([k for _w, k in choices], weights=[w for w, _k in choices])[0]
        if kind == "deliver":
            etcd.deliver(rng.choice(streams), rng.choice((1, 1, 2, 3)))
        elif kind in ("answer", "lost", "fail"):
            call = rng.choice(etcd.calls)
            outcome = "ok" if kind == "answer" else kind
            if kind == "lost" and call.kind != "txn":
                outcome = "fail"
            await self.answer(call, outcome)
        elif kind == "request":
            self.request()
        elif kind == "peer":
            await self.peer_write()
        elif kind == "relist":
            rng.choice(self.sidecars).rec.request_full(relist=True)
        elif kind == "break":
            etcd.break_stream(rng.choice(etcd.streams))
        elif kind == "compact":
            etcd.compact()
        elif kind in ("expire", "notice", "health"):
            await self.move(kind)
        await asyncio.sleep(rng.choice((0.001, 0.01, 0.1, 1.0, 5.0)) if kind == "time" else 1e-6)

    async def move(self, kind: str) -> None:
        """Leadership moves (a lease expires, a deposed leader notices) or a server is ejected or returned."""
        election, rng = self.election, self.rng
        if kind == "expire":
            holder = election.holder(self.etcd.revision)
            successor = rng.choice([i for i in range(len(self.sidecars)) if i != holder])
            old = await election.expire(successor)
            self.sidecars[successor].rec.request_full()
            if old is not None and rng.random() < 0.5:
                self.sidecars[old].rec.request_full()  # its periodic pass, still believing it leads
        elif kind == "notice":
            election.notice(rng.choice(sorted(election.unaware)))
        else:
            leaders = [s.rec for s, leader in zip(self.sidecars, election.leaders, strict=True) if leader.believes]
            self.verdicts.flip(rng, [IngressRef(AUTHORITY, f"i{n}") for n in range(INGRESSES)], leaders)

    async def answer(self, call: Call, outcome: str) -> None:
        before = self.etcd.revision
        await self.etcd.answer(call, outcome)
        if call.kind == "txn" and outcome == "ok" and self.etcd.revision > before and call.owner is not None:
            if why := self.election.deposed_write(call.owner, [key for key, _value in call.ops], self.etcd.revision):
                self.violations.append(("no own write from a deposed leader", why))
            for key, _value in call.ops:
                ref = LAYOUT.record_ref(key) or LAYOUT.owner_of_key(key)
                if ref is not None:
                    self.commits[call.owner][ref] = self.etcd.revision

    def request(self) -> None:
        """Send one request of the campaign's mix to a sidecar."""
        rng = self.rng
        sidecar = rng.choice(self.sidecars)
        name = f"i{rng.randrange(INGRESSES)}"
        ref = IngressRef(AUTHORITY, name)
        kind = rng.choices(["upsert", "stale", "duplicate", "remove", "remove-any", "two"], weights=[5, 1, 1, 2, 0.5, 1])[0]
        upserts: list[Record] = []
        removes: list[Removal] = []
        if kind == "duplicate" and self.sent:
            upserts, removes = rng.choice(self.sent)
        elif kind == "stale" and self.issued.get(name, 0) > 1:
            upserts = [self.upsert(name, rng.randrange(1, self.issued[name]), path="/stale")]
        elif kind == "remove":
            removes = [Removal(ref, self.next_revision(name))]
        elif kind == "remove-any":
            removes = [Removal(ref, None)]
        elif kind == "two":
            other = f"i{(int(name[1:]) + 1) % INGRESSES}"
            upserts = [self.upsert(name, self.next_revision(name)), self.upsert(other, self.next_revision(other))]
        else:
            upserts = [self.upsert(name, self.next_revision(name))]
        self.sent.append((upserts, removes))
        self.requests.append(asyncio.create_task(self.submit(sidecar.rec, upserts, removes)))

    def next_revision(self, name: str) -> int:
        self.issued[name] = self.issued.get(name, 0) + 1
        return self.issued[name]

    def upsert(self, name: str, revision: int, path: str = "/") -> Record:
        edge = self.rng.choice(EDGES)
        return record(name, revision=revision, path_prefix=path, upstream={"servers": [{"url": url} for url in SERVERS]}, **edge)

    async def submit(self, rec: Reconciler, upserts: list[Record], removes: list[Removal]) -> None:
        try:
            await rec.submit(upserts, removes)
        except ExporterError:
            return
        for upsert in upserts:
            self.ack(upsert.key, (upsert.revision, False))
        for removal in removes:
            if removal.revision is not None:
                self.ack(removal.ref, (removal.revision, True))

    def ack(self, ref: IngressRef, state: tuple[int, bool]) -> None:
        self.acked[ref] = max(state, self.acked.get(ref, (0, False)))

    async def peer_write(self) -> None:
        """Another writer edits or deletes a key an ingress owns under the root."""
        owned = sorted(k for k in self.etcd.keys(ROOT + "/") if LAYOUT.owner_of_key(k) is not None and k.endswith(("/rule", "/url")))
        if not owned:
            return
        key = self.rng.choice(owned)
        if key.endswith("/rule") and self.rng.random() < 0.3:
            await self.etcd.delete(key)
        else:
            await self.etcd.put(key, "Host(`peer.test`)" if key.endswith("/rule") else "http://10.9.9.9:1")

    # ----- invariants

    def check(self, step: int) -> None:
        """Every invariant, after one step."""
        for what, detail in self.violations:
            raise Failure(what, step, detail)
        for index, sidecar in enumerate(self.sidecars):
            summary = sidecar.rec.mirror_summary()
            if not summary.revision:
                continue
            if summary.digest != self.etcd.digests[summary.revision]:
                raise Failure("mirror is etcd at its revision", step, f"sidecar {index} at R={summary.revision}")
            generation, revision = sidecar.seen
            if summary.generation == generation and summary.revision < revision:
                raise Failure("R never decreases in a generation", step, f"sidecar {index}: {revision} -> {summary.revision}")
            sidecar.seen = (summary.generation, summary.revision)
        if self.etcd.revision != self.checked_revision:
            self.checked_revision = self.etcd.revision
            held = self.etcd.keys(ROOT + "/")
            if found := dangling(held, ROOT):
                raise Failure("no router names a missing object", step, f"at revision {self.etcd.revision}: {found[0]}")
        for ref, state in self.acked.items():
            value = self.etcd.value(LAYOUT.record_key(ref))
            stored = decode_record(value) if value is not None else None
            if stored is None or (stored.revision, stored.removed) < state:
                now = (stored.revision, stored.removed) if stored else None
                raise Failure("no acknowledged write lost", step, f"{ref}: acknowledged {state}, etcd holds {now}")

    def converged(self) -> bool:
        return not self.unconverged()

    def unconverged(self) -> str:
        """What keeps the world from having converged ("" when it has)."""
        if any(not t.done() for t in self.requests):
            return "requests unanswered"
        newest = max((rev for rev, key, _v in self.etcd.log if key.startswith(PREFIXES)), default=0)
        for index, sidecar in enumerate(self.sidecars):
            rec = sidecar.rec
            if rec.mirror_summary().revision < newest:
                return f"sidecar {index} at R={rec.mirror_summary().revision} < {newest}"
            if not rec.status.synced:
                return f"sidecar {index} not synced"
            plan = rec.preview([], [])
            if plan.units:
                return f"sidecar {index} diff: {[c.key for u in plan.units for c in u.changes][:3]}"
        return ""
