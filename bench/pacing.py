"""Large roots: pushes against a Traefik whose every rebuild takes D seconds, with the writer paced to it.

Per run, on a fresh etcd started with the limits docs/operations.md recommends for large roots,
a Traefik (throttle 100 ms) and the daemon next to it (`traefik.api_url` set):

1. Bulk into an empty root: N ingresses pushed as 20 requests, one after the other. Measured:
   from the last 204 until Traefik is idle again, and how long one push made 5 s after the last
   204 takes to be listed by Traefik. From a watch of the root and Traefik's beacon (polled every
   50 ms): from the last 204 until Traefik serves the whole bulk, and how many configurations it
   applied meanwhile (its rebuilds, the one serving the bulk included; `--timeline` prints them).
2. D, the floor: with N in place and Traefik idle, a bare client writes the keys of one more
   ingress as one transaction; seconds until Traefik lists it.
3. Traefik busy (a push just written): single-ingress pushes one after the other, push-to-204
   p99, against bare 10-put transactions (outside the root) sent at the same time: the ratio.
4. Steady load: `--clients` clients push new revisions of the ingresses in place (the root
   keeps its size), one single-ingress request after the other, for `--duration` s. Every
   commit under the root is seen through a watch (its revision, the beacon it wrote, which
   revision of an ingress its keys hold: the servers' port); Traefik's shown beacon is polled
   every 50 ms. Per push: from its 204 to the first poll showing applied a commit that holds
   that revision or a newer one. Reported: the worst and the median, the worst of the first and
   of the last 10 s, as multiples of D; and how many revisions under the root (configurations
   Traefik had to apply) against `duration / D`.

Targets (medians of --runs): 1. idle within 3 x D of the last 204 in every run, at most 2 rebuilds
before the whole bulk is served, the later push listed within 3 x D; 3. p99 <= 3x the bare
transaction; 4. every push served within 2.5 x D, the last 10 s no worse than the first, at most
1.2 x (duration / D) configurations.

Every ingress carries the model-serving edge fields with `--edge` (equal settings) or
`--edge-distinct` (each its own allowlist): D is then that workload's, and so are the multiples.

Usage: .venv/bin/python -m bench.pacing [--ingresses 10000] [--runs 3] [--duration 60] [--clients 10] [--edge | --edge-distinct]
       [--only bulk] [--timeline]
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import itertools
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.common import ROOT_KEY, body, ingress_body, ingress_keys, make_records, until_idle, until_listed
from bench.harness import HEADERS, arguments, cpu_seconds, median, pct, start_daemon, wait_up
from exporter.embedded import RECOMMENDED_ETCD_FLAGS, EmbeddedEtcd, EmbeddedTraefik, start_etcd, start_traefik
from exporter.etcd.client import EtcdClient
from exporter.etcd.types import Op, WatchEvent
from exporter.ingress import Ingress
from exporter.keys import KeyLayout
from exporter.store.records import Record
from exporter.traefik.api import TraefikApi

AUTHORITY = "bench"
LAYOUT = KeyLayout(ROOT_KEY, "traefik-etcd-exporter/records")
ROOT = LAYOUT.root(AUTHORITY)
BEACON = LAYOUT.beacon_key(ROOT)


@dataclass
class Run:
    # The workload's edge fields (bench/common.py EDGES): "" typical, "equal", "distinct".
    edge: str = ""
    figures: dict[str, float] = field(default_factory=dict)
    # The bulk's last 204, when Traefik served the whole bulk, and what happened under the root.
    timeline: tuple[float, float, Timeline] | None = None


async def _push(session: aiohttp.ClientSession, base: str, ids: itertools.count[int], edge: str) -> tuple[str, float]:
    """One new single-ingress upsert of the workload; its router's name and its push-to-204 seconds."""
    n = next(ids)
    record = Record.of(Ingress.model_validate(ingress_body(n, AUTHORITY, edge=edge)))
    started = time.perf_counter()
    async with session.post(f"{base}/v2/ingress/upsert", data=body([record]), headers=HEADERS) as resp:
        if resp.status != 204:
            raise RuntimeError(f"upsert answered {resp.status}: {await resp.text()}")
    return f"{AUTHORITY}_i{n}@etcd", time.perf_counter() - started


@asynccontextmanager
async def _stack(tmp: Path, log: Path | None) -> AsyncIterator[tuple[EmbeddedEtcd, EmbeddedTraefik, str, int]]:
    etcd = start_etcd(tmp, extra_args=RECOMMENDED_ETCD_FLAGS)
    traefik = start_traefik(tmp, etcd.url, ROOT, ["web"])
    level = {"EXPORTER_LOG__LEVEL": "INFO"} if log else {}
    proc, base, _control = start_daemon(
        etcd.url, tmp, EXPORTER_TRAEFIK__API_URL=traefik.api, EXPORTER_API__SERVED_TIMEOUT="600", **level,
    )
    try:
        yield etcd, traefik, base, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)
        traefik.stop()
        etcd.stop()
        if log:
            shutil.copy(tmp / "daemon.log", log)


@dataclass
class Timeline:
    """What happened under the root, as a watch and Traefik's API show it: etcd revisions with when they
    were seen, and the beacon Traefik served at each poll (every 50 ms)."""

    revisions: list[tuple[float, int]] = field(default_factory=list)
    beacons: dict[str, int] = field(default_factory=dict)  # beacon value -> etcd revision
    keys: dict[str, int] = field(default_factory=dict)  # key -> the revision that last wrote it
    shown: list[tuple[float, str | None]] = field(default_factory=list)  # poll time -> the beacon shown

    def applied(self) -> tuple[list[float], list[int]]:
        """Poll times, and the newest revision Traefik had applied by each (never decreasing). Mapped
        now, not at the poll: a poll may see a beacon before the watch has delivered its revision."""
        times, revisions, newest = [], [], 0
        for at, value in self.shown:
            newest = max(newest, self.beacons.get(value or "", 0))
            times.append(at)
            revisions.append(newest)
        return times, revisions

    def served_at(self, key: str) -> float | None:
        """When Traefik first showed a configuration holding the revision that wrote `key` (None: not yet)."""
        written = self.keys.get(key)
        times, applied = self.applied()
        k = bisect.bisect_left(applied, written) if written is not None else len(applied)
        return times[k] if k < len(times) else None

    def applied_between(self, start: float, end: float) -> list[tuple[float, int]]:
        """The configurations Traefik began to serve in (start, end]: each poll showing a newer beacon."""
        out, newest = [], 0
        for at, rev in zip(*self.applied(), strict=True):
            if start < at <= end and rev > newest:
                out.append((at, rev))
            if at <= end:
                newest = max(newest, rev)
        return out


@asynccontextmanager
async def _recording(
    etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, seen: Callable[[WatchEvent], None] | None = None,
) -> AsyncIterator[Timeline]:
    """A timeline of the root while the block runs; `seen` is also given every event under the root."""
    timeline = Timeline()
    async with EtcdClient([etcd.url]) as client:
        start_rev = (await client.range_prefix(BEACON)).revision + 1

        async def watch() -> None:
            async for events in client.watch_prefix(ROOT + "/", start_rev, idle_timeout=3600):
                for e in events:
                    if not timeline.revisions or timeline.revisions[-1][1] != e.mod_revision:
                        timeline.revisions.append((time.monotonic(), e.mod_revision))
                    if e.key == BEACON and e.value:
                        timeline.beacons[e.value] = e.mod_revision
                    elif e.value:
                        timeline.keys[e.key] = e.mod_revision
                    if seen is not None:
                        seen(e)

        async def poll() -> None:
            api = TraefikApi(traefik.api)
            try:
                while True:
                    timeline.shown.append((time.monotonic(), await api.beacon()))
                    await asyncio.sleep(0.05)
            finally:
                await api.close()

        tasks = [asyncio.create_task(watch()), asyncio.create_task(poll())]
        try:
            yield timeline
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _bulk(session: aiohttp.ClientSession, base: str, etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, n: int, run: Run) -> None:
    records = make_records(n, edge=run.edge)
    step = max(1, n // 20)
    async with _recording(etcd, traefik) as timeline:
        for i in range(0, n, step):
            async with session.post(f"{base}/v2/ingress/upsert", data=body(records[i : i + step]), headers=HEADERS) as resp:
                if resp.status != 204:
                    raise RuntimeError(f"bulk answered {resp.status}: {await resp.text()}")
        last = time.monotonic()
        later = asyncio.create_task(_later_push(session, base, traefik, last + 5, run.edge))
        await until_listed(traefik, f"{AUTHORITY}_i{n - 1}@etcd")
        await until_idle(traefik)
        run.figures["bulk idle after last 204"] = time.monotonic() - last
        run.figures["bulk later push listed"] = await later
        await until_idle(traefik)
    # From the beacons Traefik showed (polled every 50 ms): the router listing above can wait long on an
    # API busy with the next rebuild.
    served = timeline.served_at(f"{ROOT}/http/routers/{AUTHORITY}_i{n - 1}/rule")
    if served is None:
        raise RuntimeError("the bulk's last router was listed, but no configuration holding it was seen")
    run.figures["bulk served after last 204"] = served - last
    # Rebuilds after the last 204 until the whole bulk is served: the configurations Traefik began to serve
    # meanwhile, the one serving the bulk included.
    run.figures["bulk rebuilds after last 204"] = len(timeline.applied_between(last, served))
    run.figures["bulk revisions after last 204"] = sum(1 for at, _rev in timeline.revisions if last < at <= served)
    run.timeline = (last, served, timeline)


async def _later_push(session: aiohttp.ClientSession, base: str, traefik: EmbeddedTraefik, at: float, edge: str) -> float:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    name, _ = await _push(session, base, itertools.count(2_000_000), edge)
    started = time.monotonic()
    await until_listed(traefik, name)
    return time.monotonic() - started


async def _floor(etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, n: int, edge: str) -> float:
    """D: one more ingress's keys (no record: foreign to the exporter, left alone) as one bare transaction."""
    extra = make_records(n + 1, authority=AUTHORITY, edge=edge)[n:]
    keys = [(k, v) for k, v in ingress_keys(extra)[0] if k.startswith(ROOT)]
    renamed = [(k.replace(f"{AUTHORITY}_i{n}", "bare_floor"), v) for k, v in keys]
    async with EtcdClient([etcd.url]) as client:
        await client.txn([], [Op(k, v) for k, v in renamed])
        listed = await until_listed(traefik, "bare_floor@etcd")
        await until_idle(traefik)
        await client.txn([], [Op(k, None) for k, _ in renamed])
    await until_idle(traefik)
    return listed


async def _busy(session: aiohttp.ClientSession, base: str, etcd: EmbeddedEtcd, run: Run, samples: int = 200) -> None:
    ids = itertools.count(3_000_000)
    await _push(session, base, ids, run.edge)  # Traefik now rebuilds for D seconds
    pushes: list[float] = []
    bare: list[float] = []
    async with aiohttp.ClientSession() as raw:
        for s in range(samples):
            pushes.append((await _push(session, base, ids, run.edge))[1])
            txn = {"success": [{"request_put": {"key": _b64(f"bench-bare/{s}/{k}"), "value": _b64("x" * 40)}} for k in range(10)]}
            started = time.perf_counter()
            async with raw.post(f"{etcd.url}/v3/kv/txn", json=txn) as resp:
                await resp.read()
            bare.append(time.perf_counter() - started)
    run.figures["busy push p99"] = pct(pushes, 0.99)
    run.figures["busy bare p99"] = pct(bare, 0.99)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def _update(session: aiohttp.ClientSession, base: str, i: int, revision: int, edge: str) -> None:
    """A new revision of in-place ingress `i`: its servers' port says which revision it is (8000 + revision)."""
    record = Record.of(Ingress.model_validate(ingress_body(i, AUTHORITY, revision, 8000 + revision, edge)))
    async with session.post(f"{base}/v2/ingress/upsert", data=body([record]), headers=HEADERS) as resp:
        if resp.status != 204:
            raise RuntimeError(f"upsert answered {resp.status}: {await resp.text()}")


async def _steady(
    session: aiohttp.ClientSession, base: str, etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, run: Run, duration: float,
    clients: int, n: int,
) -> None:
    acked: list[tuple[int, int, float]] = []  # (ingress, revision, 204 at)
    versions: dict[int, list[tuple[int, int]]] = {}  # ingress -> (etcd revision, its revision) as its keys commit
    stop = asyncio.Event()

    def seen(e: WatchEvent) -> None:
        if e.value and e.key.endswith("/servers/000/url"):
            i = int(e.key.split("/services/")[1].split("/")[0].removeprefix(f"{AUTHORITY}_i"))
            versions.setdefault(i, []).append((e.mod_revision, int(e.value.rsplit(":", 1)[1]) - 8000))

    async def pusher(k: int) -> None:
        # Each client updates its own share of the ingresses in place, one revision after the other.
        mine = list(range(k, n, clients))
        for turn in itertools.count(2):
            for i in mine:
                if stop.is_set():
                    return
                await _update(session, base, i, turn, run.edge)
                acked.append((i, turn, time.monotonic()))

    async with _recording(etcd, traefik, seen) as timeline:
        began = time.monotonic()
        tasks = [asyncio.create_task(pusher(k)) for k in range(clients)]
        await asyncio.sleep(duration)
        stop.set()
        await asyncio.gather(*tasks)
        window_revisions = len(timeline.revisions)
        deadline = time.monotonic() + 600
        while None in _served_after(acked, versions, timeline) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    served = _served_after(acked, versions, timeline)
    done = [s for s in served if s is not None]
    first = [s for (_i, _r, at), s in zip(acked, served, strict=True) if s is not None and at - began <= 10]
    last = [s for (_i, _r, at), s in zip(acked, served, strict=True) if s is not None and at - began >= duration - 10]
    run.figures |= {
        "steady pushes": len(acked), "steady unserved": len(served) - len(done),
        "steady worst": max(done), "steady median": median(done),
        "steady first10 worst": max(first), "steady last10 worst": max(last),
        "steady revisions": window_revisions,
    }


def _served_after(
    acked: list[tuple[int, int, float]], versions: dict[int, list[tuple[int, int]]], timeline: Timeline,
) -> list[float | None]:
    """Per acknowledged push: seconds from its 204 until Traefik showed it (or a newer revision of it) applied; None: not yet.

    Its keys committed at the first etcd revision that wrote its revision of the ingress or a newer one.
    """
    times, applied = timeline.applied()
    out: list[float | None] = []
    for i, revision, at in acked:
        committed = next((rev for rev, r in versions.get(i, ()) if r >= revision), None)
        k = bisect.bisect_left(applied, committed) if committed is not None else len(applied)
        out.append(max(0.0, times[k] - at) if k < len(times) else None)
    return out


async def one_run(n: int, duration: float, clients: int, log: Path | None = None, edge: str = "", bulk_only: bool = False) -> Run:
    run = Run(edge)
    with tempfile.TemporaryDirectory(prefix="bench-pacing-") as tmp:
        async with _stack(Path(tmp), log) as (etcd, traefik, base, daemon), aiohttp.ClientSession() as session:
            await wait_up(session, base)
            bulk_cpu = cpu_seconds(traefik.proc.pid)
            await _bulk(session, base, etcd, traefik, n, run)
            run.figures["bulk traefik cpu"] = cpu_seconds(traefik.proc.pid) - bulk_cpu
            floor = await _floor(etcd, traefik, n, run.edge)
            run.figures["D"] = floor
            if bulk_only:
                return run
            await _busy(session, base, etcd, run)
            await until_idle(traefik)
            pids = {"traefik": traefik.proc.pid, "daemon": daemon, "etcd": etcd.proc.pid}
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            await _steady(session, base, etcd, traefik, run, duration, clients, n)
            for name, pid in pids.items():
                run.figures[f"steady {name} cpu"] = cpu_seconds(pid) - before[name]
    return run


async def main() -> None:
    parser = arguments(__doc__, runs=3)
    parser.add_argument("--ingresses", type=int, default=10_000)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--log", type=Path, help="keep the daemon's log (INFO) of the last run here")
    parser.add_argument("--only", choices=["bulk"], help="only the bulk and D")
    parser.add_argument("--timeline", action="store_true", help="print each bulk's revisions and Traefik's configurations")
    workload = parser.add_mutually_exclusive_group()
    workload.add_argument("--edge", action="store_const", const="equal", dest="workload", default="",
                          help="every ingress with every model-serving edge field, equal settings")
    workload.add_argument("--edge-distinct", action="store_const", const="distinct", dest="workload",
                          help="the same, each ingress with an allowlist of its own")
    args = parser.parse_args()
    runs = []
    for i in range(args.runs):
        run = await one_run(args.ingresses, args.duration, args.clients, args.log, args.workload, args.only == "bulk")
        runs.append(run)
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in run.figures.items()), flush=True)
        if args.timeline and run.timeline is not None:
            _print_timeline(*run.timeline)
    m = {key: median([r.figures[key] for r in runs]) for key in runs[0].figures}
    d = m["D"]
    rebuilds = [int(r.figures["bulk rebuilds after last 204"]) for r in runs]
    served = ", ".join(f"{r.figures['bulk served after last 204'] / r.figures['D']:.2f}" for r in runs)
    idle = ", ".join(f"{r.figures['bulk idle after last 204'] / r.figures['D']:.2f}" for r in runs)
    print(f"{args.ingresses} routers, medians of {args.runs} runs; D (one more ingress, bare, Traefik idle) = {d:.2f}s")
    print(f"bulk of {args.ingresses} into an empty root: Traefik idle {m['bulk idle after last 204']:.1f}s after the last 204 "
          f"({m['bulk idle after last 204'] / d:.2f} x D; target <= 3), a push 5 s later listed after "
          f"{m['bulk later push listed']:.1f}s ({m['bulk later push listed'] / d:.2f} x D; target <= 3); "
          f"Traefik CPU {m['bulk traefik cpu']:.0f}s")
    print(f"  per run (x D; target <= 3): Traefik idle after the last 204 {idle}; the whole bulk served {served}; "
          f"Traefik's rebuilds after the last 204 until then (target <= 2): {rebuilds}")
    if args.only == "bulk":
        return
    print(f"Traefik busy: push-to-204 p99 {m['busy push p99'] * 1000:.1f} ms, bare 10-put txn p99 "
          f"{m['busy bare p99'] * 1000:.1f} ms ({m['busy push p99'] / m['busy bare p99']:.2f}x; target <= 3)")
    print(f"{args.clients} clients for {args.duration:.0f}s: {m['steady pushes']:.0f} pushes, unserved {m['steady unserved']:.0f}; "
          f"204-to-served worst {m['steady worst']:.1f}s ({m['steady worst'] / d:.2f} x D; target <= 2.5), median "
          f"{m['steady median']:.1f}s; worst of the first 10 s {m['steady first10 worst']:.1f}s, of the last 10 s "
          f"{m['steady last10 worst']:.1f}s; {m['steady revisions']:.0f} revisions under the root "
          f"({m['steady revisions'] / (args.duration / d):.2f} x duration/D; target <= 1.2); "
          f"CPU: Traefik {m['steady traefik cpu']:.0f}s, daemon {m['steady daemon cpu']:.0f}s, etcd {m['steady etcd cpu']:.0f}s")


def _print_timeline(last: float, served: float, timeline: Timeline) -> None:
    """Seconds from the bulk's last 204: each revision under the root as the watch saw it, and each
    configuration Traefik began to serve (its beacon's revision)."""
    first = timeline.revisions[0][0] if timeline.revisions else last
    applied = timeline.applied_between(first - 1, served + 1)
    print("  revisions seen: " + " ".join(f"{at - last:+.2f}:r{rev}" for at, rev in timeline.revisions if at <= served + 1))
    print("  Traefik serves: " + " ".join(f"{at - last:+.2f}:r{rev}" for at, rev in applied))


if __name__ == "__main__":
    asyncio.run(main())
