"""Probe capacity: targets at a 1 s interval one engine sustains with scheduling lag p99 < 100 ms,
against a raw aiohttp request loop to the same local backends in the same run.

The backends run in a separate process (4 servers on loopback ports, a bare asyncio protocol that
answers 200 and closes: the cheapest server Python has, so the cores go to the probers).
With `--sidecars K`, each count of targets is probed by one sidecar process and then by K, each
with `health.sharding: on` on a fresh etcd (the shares settle before the measurement), in the same run.
It prints the CPU a probe costs its sidecar and the backends, and the bound that puts on the cores.
Usage: .venv/bin/python -m bench.probe_capacity [--seconds 8] [--targets 3000,4500,6000,7500] [--sidecars 3]
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from loguru import logger

from bench.common import fresh_etcd
from bench.harness import arguments, cpu_seconds, median, pct
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


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller, as on this machine


# A 10 ms period, not the kernel's 100 ms: a sidecar out of quota waits at most the rest of a short period,
# so the lag measured is the sidecar's, not the throttle's.
CFS_PERIOD_US = 10_000


def limit_cpu(pid: int, name: str, cores: float) -> Path:
    """Hold `pid` to `cores` of CPU (a CFS quota, as a Kubernetes CPU limit is) in a cgroup of its own; its path."""
    group = CPU_CGROUP / name
    group.mkdir()
    (group / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
    (group / "cpu.cfs_quota_us").write_text(str(int(cores * CFS_PERIOD_US)))
    (group / "cgroup.procs").write_text(str(pid))
    return group


@dataclass
class Sharded:
    """One measurement of `sidecars` processes sharing the targets."""

    p99: float  # the worst sidecar's scheduling lag p99
    rate: float  # their probes/s together
    shares: list[int]
    cpu: float  # the median CPU seconds a sidecar spends per probe
    backend_cpu: float  # the backends' CPU seconds per probe


async def sharded_run(etcd_url: str, backends: int, ports: list[int], targets: int, sidecars: int, seconds: float,
                      cpu_limit: float | None = None) -> Sharded:
    """`sidecars` processes sharing `targets` through etcd, measured together; each held to `cpu_limit` cores if given."""
    space = f"bench-shards-{time.time_ns()}"
    args = [etcd_url, space, str(targets), str(sidecars), str(seconds), *map(str, ports)]
    procs = [await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.probe_sidecar", *args,
                                                  stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
             for _ in range(sidecars)]
    groups = [limit_cpu(proc.pid, f"{space}-{k}", cpu_limit) for k, proc in enumerate(procs)] if cpu_limit else []
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=120)
            assert line.strip() == b"ready", line
        backend_started = cpu_seconds(backends)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        results = [json.loads(await proc.stdout.readline()) for proc in procs if proc.stdout is not None]
        backend_spent = cpu_seconds(backends) - backend_started
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
            await proc.wait()
        for group in groups:
            group.rmdir()
    rate = sum(r["rate"] for r in results)
    return Sharded(max(r["p99"] for r in results), rate, sorted(r["share"] for r in results),
                   median([r["cpu"] for r in results]), backend_spent / max(rate * seconds, 1))


async def compare_sidecars(backends: int, ports: list[int], counts: list[int], sidecars: int, seconds: float,
                           cpu_limit: float | None) -> None:
    """Each count of targets on one sharded sidecar, then on `sidecars`, in the same run (each held to `cpu_limit`)."""
    best = dict.fromkeys((1, sidecars), 0)
    costs: list[tuple[float, float]] = []
    with fresh_etcd() as etcd:
        for n in counts:
            for k in (1, sidecars):
                run = await sharded_run(etcd.url, backends, ports, n, k, seconds, cpu_limit)
                ok = run.p99 < 0.1
                best[k] = max(best[k], n) if ok else best[k]
                costs.append((run.cpu, run.backend_cpu))
                print(f"{n} targets at 1 s on {k} sidecar(s) (shares {run.shares}): {run.rate:.0f} probes/s, "
                      f"{run.cpu * 1e6:.0f} us CPU per probe per sidecar, {run.backend_cpu * 1e6:.0f} us in the backends, "
                      f"worst scheduling lag p99 {run.p99 * 1000:.0f} ms {'ok' if ok else '> 100 ms'}")
    ratio = best[sidecars] / best[1] if best[1] else float("inf")
    print(f"capacity with p99 lag < 100 ms: {best[1]} targets on 1 sidecar, {best[sidecars]} on {sidecars} ({ratio:.2f}x)")
    print(what_the_cores_allow(costs, sidecars, cpu_limit))


def what_the_cores_allow(costs: list[tuple[float, float]], sidecars: int, cpu_limit: float | None) -> str:
    """The probes/s the CPU allows, from the medians of what a probe costs its sidecar and the backends."""
    sidecar, backend = median([c for c, _ in costs]), median([b for _, b in costs])
    cores = os.cpu_count() or 1
    one = (cpu_limit or 1.0) / sidecar  # a sidecar is one thread: one core at most
    machine = cores / (sidecar + backend)
    every = min(machine, sidecars * one)
    return (f"what the cores allow: a probe costs {sidecar * 1e6:.0f} us in its sidecar and {backend * 1e6:.0f} us in the "
            f"backends (medians): one sidecar on {cpu_limit or 1.0:g} core(s) at most {one:.0f} probes/s, {sidecars} at most "
            f"{every:.0f} ({every / one:.2f}x one; this machine's {cores} cores, backends included, at most {machine:.0f})")


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
    parser.add_argument("--targets", default="3000,4500,6000,7500")
    parser.add_argument("--sidecars", type=int, default=0, help="compare one sharded sidecar with this many")
    parser.add_argument("--cpu-limit", type=float, default=None,
                        help="hold each sidecar to this many cores, as a pod's CPU limit does (a cgroup; needs root)")
    args = parser.parse_args()
    logger.remove()
    ports = [free_port() for _ in range(4)]
    backends = subprocess.Popen([sys.executable, "-c", BACKENDS, *map(str, ports)])
    try:
        await asyncio.sleep(1.5)
        raw = await raw_rate(ports, args.seconds)
        print(f"raw aiohttp loop (new connection per request, 64 in flight): {raw:.0f} requests/s")
        if args.sidecars:
            counts = [int(n) for n in args.targets.split(",")]
            await compare_sidecars(backends.pid, ports, counts, args.sidecars, args.seconds, args.cpu_limit)
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
