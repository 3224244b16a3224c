"""Probe capacity: targets at a 1 s interval one engine sustains with scheduling lag p99 < 100 ms,
against a raw aiohttp request loop to the same local backends in the same run.

The backends run in a separate process (4 aiohttp servers on loopback ports).
With `--sidecars K`, each count of targets is probed by one sidecar process and then by K, each
with `health.sharding: on` on a fresh etcd (the shares settle before the measurement), in the same run.
Usage: .venv/bin/python -m bench.probe_capacity [--seconds 8] [--targets 1000,2000,3000,4000] [--sidecars 3]
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import aiohttp
from loguru import logger

from bench.common import fresh_etcd
from bench.harness import arguments, median, pct
from exporter.embedded import free_port
from exporter.health.checkers import load_kinds
from exporter.health.engine import HealthEngine
from exporter.health.kinds import BUILTIN
from exporter.ingress import Ingress
from exporter.keys import IngressRef
from exporter.metrics import Metrics
from exporter.reconcile import Inbox

BACKENDS = """
import asyncio, sys
OK = b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\nConnection: close\\r\\n\\r\\nok"
class Health(asyncio.Protocol):
    def connection_made(self, transport): self.transport = transport
    def data_received(self, data):
        if b"\\r\\n\\r\\n" in data: self.transport.write(OK); self.transport.close()
async def main():
    for port in map(int, sys.argv[1:]):
        await asyncio.get_running_loop().create_server(Health, "127.0.0.1", port, backlog=4096)
    await asyncio.Event().wait()
asyncio.run(main())
"""


class Lag:
    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, value: float) -> None:
        self.values.append(value)


def lagged() -> tuple[Lag, Metrics]:
    lag = Lag()
    metrics = Metrics()
    metrics.schedule_lag = lag  # type: ignore[assignment]  # every value, for a p99 (a histogram keeps buckets)
    return lag, metrics


def add_targets(engine: HealthEngine, ports: list[int], targets: int) -> None:
    for n in range(targets):
        port = ports[n % len(ports)]
        ingress = Ingress.model_validate({
            "authority": "bench", "id": f"t{n}", "revision": 1, "hosts": ["b.test"],
            # Distinct URLs (query-free): a path per target keeps nodes unique.
            "upstream": {"servers": [{"url": f"http://127.0.0.{1 + n // 60000}:{port}"}]},
            "health_check": {"enable": True, "interval": 1.0, "max_wait_time": 2.0, "initial_delay": 0},
        })
        engine.update(IngressRef("bench", f"t{n}"), ingress)


async def engine_run(ports: list[int], targets: int, seconds: float) -> tuple[float, float]:
    lag, metrics = lagged()
    engine = HealthEngine(load_kinds(BUILTIN), Inbox(), concurrency=512, metrics=metrics)
    add_targets(engine, ports, targets)

    def probes() -> float:
        return metrics.value("exporter_health_probes_total", {"result": "success"})

    await engine.start()
    await asyncio.sleep(2)  # warm-up: first probes are spread over 0.1 s
    lag.values.clear()
    start_count, started = probes(), time.perf_counter()
    await asyncio.sleep(seconds)
    rate = (probes() - start_count) / (time.perf_counter() - started)
    await engine.stop()
    return pct(lag.values, 0.99), rate


async def sharded_run(
    etcd_url: str, ports: list[int], targets: int, sidecars: int, seconds: float
) -> tuple[float, float, list[int], float]:
    """`sidecars` processes sharing `targets` through etcd: the worst p99 lag, their probes/s together, each one's share
    and the median CPU seconds a sidecar spends per probe."""
    space = f"bench-shards-{time.time_ns()}"
    args = [etcd_url, space, str(targets), str(sidecars), str(seconds), *map(str, ports)]
    procs = [await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.probe_sidecar", *args,
                                                  stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
             for _ in range(sidecars)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=120)
            assert line.strip() == b"ready", line
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        results = [json.loads(await proc.stdout.readline()) for proc in procs if proc.stdout is not None]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
            await proc.wait()
    cpu = median([r["cpu"] for r in results])
    return max(r["p99"] for r in results), sum(r["rate"] for r in results), sorted(r["share"] for r in results), cpu


async def compare_sidecars(ports: list[int], counts: list[int], sidecars: int, seconds: float) -> None:
    """Each count of targets on one sharded sidecar, then on `sidecars`, in the same run."""
    best = dict.fromkeys((1, sidecars), 0)
    with fresh_etcd() as etcd:
        for n in counts:
            for k in (1, sidecars):
                p99, rate, shares, cpu = await sharded_run(etcd.url, ports, n, k, seconds)
                ok = p99 < 0.1
                best[k] = max(best[k], n) if ok else best[k]
                print(f"{n} targets at 1 s on {k} sidecar(s) (shares {shares}): {rate:.0f} probes/s, {cpu * 1e6:.0f} us CPU "
                      f"per probe per sidecar, worst scheduling lag p99 {p99 * 1000:.0f} ms {'ok' if ok else '> 100 ms'}")
    ratio = best[sidecars] / best[1] if best[1] else float("inf")
    print(f"capacity with p99 lag < 100 ms: {best[1]} targets on 1 sidecar, {best[sidecars]} on {sidecars} ({ratio:.2f}x)")


async def raw_rate(ports: list[int], seconds: float, concurrency: int = 64) -> float:
    done = 0
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=concurrency)) as session:

        async def worker(k: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with session.get(f"http://127.0.0.1:{ports[k % len(ports)]}/health") as resp:
                    await resp.read()
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        return done / (time.perf_counter() - started)


async def main() -> None:
    parser = arguments(__doc__, runs=None)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--targets", default="1000,1500,2000,3000")
    parser.add_argument("--sidecars", type=int, default=0, help="compare one sharded sidecar with this many")
    args = parser.parse_args()
    logger.remove()
    ports = [free_port() for _ in range(4)]
    backends = subprocess.Popen([sys.executable, "-c", BACKENDS, *map(str, ports)])
    try:
        await asyncio.sleep(1.5)
        raw = await raw_rate(ports, args.seconds)
        print(f"raw aiohttp loop (new connection per request, 64 in flight): {raw:.0f} requests/s")
        if args.sidecars:
            await compare_sidecars(ports, [int(n) for n in args.targets.split(",")], args.sidecars, args.seconds)
            return
        best = 0
        for n in map(int, args.targets.split(",")):
            p99, rate = await engine_run(ports, n, args.seconds)
            ok = p99 < 0.1
            best = n if ok else best
            print(f"{n} targets at 1 s: {rate:.0f} probes/s ({rate / raw:.0%} of raw), scheduling lag p99 {p99 * 1000:.0f} ms"
                  f" {'ok' if ok else '> 100 ms'}")
        print(f"capacity with p99 lag < 100 ms: {best} targets (target >= 2000, and >= 70% of the raw rate)")
    finally:
        backends.terminate()


if __name__ == "__main__":
    asyncio.run(main())
