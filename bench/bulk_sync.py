"""Writer benchmarks, printed as ratios against raw etcd writes measured in the same run.

1. Bulk sync of N ingresses into an empty etcd, versus writing the very same keys with bare
   128-op transactions (same number in flight). Target: <= 1.5x. Also the same bare writes
   while two watch streams read them back, as the exporter's mirror must (its watches are
   how it sees anyone else's writes): what etcd alone charges for the watch.
2. Latency to commit one ingress change with 10 versus N ingresses in place. Target: <= 1.5x.
3. RSS of a daemon process holding N ingresses (from ingress files; push API and health engine on),
   in its steady state (`--rss`; `--edge`: every edge field on each). Target: <= 200 MB.
   `--heap`: what an in-process reconciler holding N keeps, by the line that allocated it (tracemalloc).

Usage: .venv/bin/python -m bench.bulk_sync [--ingresses 10000] [--runs 3]
Profile: .venv/bin/py-spy record -r 250 -f raw -o bulk.txt -- .venv/bin/python -m bench.bulk_sync --profile
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from loguru import logger

from bench.common import RECORDS, exporter_keys, fresh_etcd, make_records, raw_write, watching
from bench.harness import arguments, median, memory_mb
from exporter.assembly import build_reconciler
from exporter.config import Settings
from exporter.embedded import free_port
from exporter.etcd.client import EtcdClient
from exporter.gc_tuning import tune_gc
from exporter.ingress import Ingress
from exporter.reconcile import Reconciler
from exporter.store.records import Record

IN_FLIGHT = 8


def _settings(url: str) -> Settings:
    return Settings.model_validate({"etcd": {"endpoints": [url]}, "writer": {"max_in_flight": IN_FLIGHT, "coalesce_window": 0.005}})


@asynccontextmanager
async def running_reconciler(in_place: int = 0) -> AsyncIterator[Reconciler]:
    """A reconciler on a fresh etcd, synced, with `in_place` ingresses already committed."""
    with fresh_etcd() as etcd:
        async with EtcdClient([etcd.url]) as client:
            rec = build_reconciler(_settings(etcd.url), client)
            await rec.start()
            await rec.wait_synced(30)
            await submit_all(rec, make_records(in_place))
            yield rec
            await rec.stop()


async def submit_all(rec: Reconciler, records: list[Record]) -> None:
    # As ingress files or pushes would: requests of at most 1,000 ingresses.
    await asyncio.gather(*(rec.submit(records[i : i + 1000]) for i in range(0, len(records), 1000)))


async def exporter_bulk(n: int) -> float:
    records = make_records(n)
    async with running_reconciler() as rec:
        started = time.perf_counter()
        await submit_all(rec, records)
        return time.perf_counter() - started


async def raw_bulk(n: int, watched: bool = False) -> tuple[float, int]:
    kvs = exporter_keys(make_records(n))
    with fresh_etcd() as etcd:
        if not watched:
            return await raw_write(etcd.url, kvs, IN_FLIGHT), len(kvs)
        async with watching(etcd.url, ["traefik/", RECORDS + "/"]):
            return await raw_write(etcd.url, kvs, IN_FLIGHT), len(kvs)


async def change_latency(in_place: int, samples: int = 30) -> float:
    async with running_reconciler(in_place) as rec:
        latencies = []
        for s in range(samples):
            changed = make_records(1, revision=2 + s, port=9000 + s)[0]
            started = time.perf_counter()
            await rec.submit([changed])
            latencies.append(time.perf_counter() - started)
        return median(latencies)


# Every edge field on every ingress (`--rss --edge`): the most keys an ingress writes today.
EDGE = {"profile": "openai", "timeouts": {"dial": 5, "response_header": 120}, "keepalive": False,
        "limits": {"max_body_bytes": 1048576, "max_in_flight": 32, "rate": {"average": 50, "burst": 100}},
        "retry": {"attempts": 2}}


def daemon_rss(n: int, edge: bool = False) -> float:
    """MB resident in a daemon process holding `n` ingresses loaded from files (with every edge field when `edge`),
    in its steady state: after full passes that found everything as written, once monitoring has scraped it and
    the status page has been looked at."""
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "ingresses").mkdir()
        records = make_records(n)
        if edge:
            records = [Record.of(Ingress.model_validate({**r.ingress.model_dump(), **EDGE})) for r in records]
        for start in range(0, n, 1000):
            body = ["ingresses:"] + [
                "  - " + r.ingress.model_dump_json(exclude_defaults=True, exclude={"protocol"}) for r in records[start : start + 1000]
            ]
            (work / "ingresses" / f"{start}.yaml").write_text("\n".join(body) + "\n")
        control = f"127.0.0.1:{free_port()}"
        # The push API and the health engine on, as in production.
        (work / "exporter.yaml").write_text(
            f'etcd: {{endpoints: ["{etcd.url}"]}}\nsources: {{files: ["ingresses/*.yaml"]}}\ncontrol: {{listen: "{control}"}}\n'
            f'api: {{listen: "127.0.0.1:{free_port()}", token: "bench-token"}}\nwriter: {{reconcile_interval: 1}}\n'
        )
        proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--config", str(work / "exporter.yaml")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(f"http://{control}/readyz", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    time.sleep(0.2)
            while time.monotonic() < deadline and _full_passes(control) < 3:
                time.sleep(0.2)
            for path in ("/metrics", "/v1/healthcheck", "/", "/ui/state.json"):
                with urllib.request.urlopen(f"http://{control}{path}", timeout=60) as resp:
                    resp.read()
            return memory_mb(proc.pid)[0]
        finally:
            proc.terminate()
            proc.wait(30)


async def heap(n: int, edge: bool, traced: bool, top: int = 14) -> None:
    """Print how long a reconciler holding `n` ingresses takes for its full passes once all is written and, when
    `traced`, what it keeps then, by allocating line (tracing makes the passes slower)."""
    if traced:
        tracemalloc.start()
    records = make_records(n)
    if edge:
        records = [Record.of(Ingress.model_validate({**r.ingress.model_dump(), **EDGE})) for r in records]
    async with running_reconciler() as rec:
        await submit_all(rec, records)
        del records
        took = []
        for _ in range(2):  # the first pass after the writes finds everything as written, the second skips it
            passes, started = rec.status.full_passes, time.perf_counter()
            rec.request_full()
            while rec.status.full_passes == passes:
                await asyncio.sleep(0.01)
            took.append(time.perf_counter() - started)
        print(f"a reconciler with {n} ingresses{', every edge field on each' if edge else ''}: full passes after the writes "
              f"{took[0]:.2f} s (renders everything), then {took[1]:.2f} s{' (traced)' if traced else ''}")
        if not traced:
            return
        gc.collect()
        stats = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)]).statistics("lineno")
    print(f"  held: {sum(s.size for s in stats) / 1e6:.1f} MB traced")
    checkout = str(Path(__file__).resolve().parent.parent) + "/"
    for stat in stats[:top]:
        frame = stat.traceback[0]
        where = frame.filename.split("site-packages/")[-1].removeprefix(checkout)
        print(f"  {stat.size / 1e6:6.1f} MB {stat.count:8d}  {where}:{frame.lineno}")


def _full_passes(control: str) -> float:
    """How many full passes the daemon has made (its `exporter_reconcile_seconds` count)."""
    with urllib.request.urlopen(f"http://{control}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("exporter_reconcile_seconds_count"):
                return float(line.split()[1])
    return 0.0


async def main() -> None:
    parser = arguments(__doc__, runs=3)
    parser.add_argument("--ingresses", type=int, default=10_000)
    parser.add_argument("--profile", action="store_true", help="only the exporter's bulk sync, once (run it under py-spy)")
    parser.add_argument("--rss", action="store_true", help="only the daemon's RSS")
    parser.add_argument("--edge", action="store_true", help="with --rss or --heap: every edge field on every ingress")
    parser.add_argument("--heap", action="store_true", help="only what an in-process reconciler holds, by line")
    parser.add_argument("--passes", action="store_true", help="only an in-process reconciler's full passes at --ingresses")
    args = parser.parse_args()
    logger.remove()
    tune_gc()  # the reconciler runs in this process: collected as in the daemon
    n = args.ingresses
    if args.profile:
        cpu = time.process_time()
        wall = await exporter_bulk(n)
        print(f"exporter bulk sync of {n} ingresses: {wall:.2f}s, this process's CPU {time.process_time() - cpu:.2f}s")
        return
    if args.heap or args.passes:
        await heap(n, args.edge, traced=args.heap)
        return
    if args.rss:
        what = "ingresses, every edge field on each" if args.edge else "ingresses"
        print(f"daemon RSS holding {n} {what}: {median([daemon_rss(n, args.edge) for _ in range(args.runs)]):.0f} MB (target <= 200)")
        return

    exp, raw, watched = [], [], []
    keys = 0
    for _ in range(args.runs):
        exp.append(await exporter_bulk(n))
        seconds, keys = await raw_bulk(n)
        raw.append(seconds)
        watched.append((await raw_bulk(n, watched=True))[0])
    print(f"bulk sync of {n} ingresses ({keys} keys incl. records), {IN_FLIGHT} txns in flight, median of {args.runs}:")
    print(f"  exporter {median(exp):.2f}s   raw 128-op txns {median(raw):.2f}s   ratio {median(exp) / median(raw):.2f} (target <= 1.5)")
    print(f"  raw 128-op txns read back by two watches {median(watched):.2f}s   ratio {median(watched) / median(raw):.2f}; "
          f"exporter / watched raw {median(exp) / median(watched):.2f}")

    small = median([await change_latency(10) for _ in range(args.runs)])
    large = median([await change_latency(n) for _ in range(args.runs)])
    print(f"one-ingress change to commit, median: with 10 in place {small * 1000:.1f} ms, with {n} {large * 1000:.1f} ms, "
          f"ratio {large / small:.2f} (target <= 1.5)")

    rss = daemon_rss(n)
    print(f"daemon RSS holding {n} ingresses: {rss:.0f} MB (target <= 200)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    asyncio.run(main())
