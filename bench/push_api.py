"""Push API benchmarks, against a daemon process, with raw etcd baselines from the same run.

1. Push-to-commit latency (p50, p99) of single-ingress upserts with 10 and with N ingresses in
   place, against one bare etcd txn round trip. Target: p99 <= 3x the round trip, flat in N.
   Also the floor of any push in the same run: a relay that answers each request after one bare
   txn (bench/relay.py: the two HTTP hops, nothing else).
2. Upserts per second from 50 concurrent clients, also as a fraction of the raw etcd key
   throughput (bare 128-op txns, 8 in flight). Target: >= 1,000/s.
3. Push-to-served: 1,000 new ingresses pushed by 10 closed-loop clients, one per request and 100
   per request, until Traefik routes all (targets 3 s and 1.5 s), with the etcd revisions used and
   the CPU seconds of Traefik and of the daemon in the same run.

Usage: .venv/bin/python bench/push_api.py [--ingresses 10000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    HEADERS,
    exporter_keys,
    fresh_etcd,
    make_records,
    median,
    pct,
    put_in_place,
    raw_write,
    start_daemon,
    txn_round_trip,
    upsert,
    wait_up,
)
from exporter.embedded import free_port, start_traefik
from exporter.etcd.client import EtcdClient


@dataclass
class Latencies:
    """Push-to-commit latencies, with the bare txn round trips and the relay floor of the same run."""

    pushes: list[float]
    bare: list[float]
    relay: list[float]


async def latency(in_place: int, samples: int = 200) -> Latencies:
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        proc, base, _control = start_daemon(etcd.url, Path(tmp))
        try:
            async with aiohttp.ClientSession() as session:
                await wait_up(session, base)
                await put_in_place(session, base, in_place)
                out = []
                for s in range(samples):
                    change = make_records(1, revision=2 + s, port=9000 + s % 1000)
                    started = time.perf_counter()
                    await upsert(session, base, change)
                    out.append(time.perf_counter() - started)
        finally:
            proc.terminate()
            proc.wait(30)
        return Latencies(out, await txn_round_trip(etcd.url, samples), await relay_round_trips(etcd.url, samples))


async def relay_round_trips(etcd_url: str, samples: int) -> list[float]:
    """Latencies of pushes through bench/relay.py (a process answering after one bare txn)."""
    port = free_port()
    root = Path(__file__).resolve().parent.parent
    relay = subprocess.Popen([sys.executable, "-m", "bench.relay", etcd_url, str(port)], cwd=root)
    url = f"http://127.0.0.1:{port}/push"
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 30
            out: list[float] = []
            while len(out) < samples:
                started = time.perf_counter()
                try:
                    async with session.post(url, data=b'{"ingresses":[]}', headers=HEADERS) as resp:
                        await resp.read()
                except aiohttp.ClientConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)  # the relay is still starting
                    continue
                out.append(time.perf_counter() - started)
            return out
    finally:
        relay.terminate()
        relay.wait(30)


async def throughput(total: int = 5000, clients: int = 50) -> tuple[float, float, int]:
    records = make_records(total)
    per_ingress = len(exporter_keys(records[:100])) / 100
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        proc, base, _control = start_daemon(etcd.url, Path(tmp))
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
                await wait_up(session, base)

                async def client(n: int) -> None:
                    for r in records[n::clients]:
                        await upsert(session, base, [r])

                started = time.perf_counter()
                await asyncio.gather(*(client(n) for n in range(clients)))
                rate = total / (time.perf_counter() - started)
        finally:
            proc.terminate()
            proc.wait(30)
    with fresh_etcd() as etcd:
        kvs = exporter_keys(records)
        raw_rate = len(kvs) / await raw_write(etcd.url, kvs, 8)
    return rate, raw_rate, round(per_ingress)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Served:
    """One push-to-served run: until Traefik serves all, the etcd revisions used, CPU seconds spent."""

    seconds: float
    revisions: int
    traefik_cpu: float
    daemon_cpu: float


async def push_to_served(n: int = 1000, clients: int = 10, per_request: int = 1) -> Served:
    """`n` new ingresses pushed by `clients` closed-loop clients, `per_request` per request, until Traefik routes all."""
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        traefik = start_traefik(Path(tmp), etcd.url, "traefik/worker_bench", ["web"])
        proc, base, _control = start_daemon(etcd.url, Path(tmp))
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session, \
                    EtcdClient([etcd.url]) as client:
                await wait_up(session, base)
                async with session.get(f"{traefik.api}/api/overview") as resp:
                    baseline = (await resp.json())["http"]["routers"]["total"]
                records = make_records(n)
                requests = [records[i : i + per_request] for i in range(0, n, per_request)]

                async def pusher(k: int) -> None:
                    for batch in requests[k::clients]:
                        await upsert(session, base, batch)

                revision, traefik_cpu, daemon_cpu = await client.revision(), cpu_seconds(traefik.proc.pid), cpu_seconds(proc.pid)
                started = time.perf_counter()
                await asyncio.gather(*(pusher(k) for k in range(clients)))
                while True:
                    async with session.get(f"{traefik.api}/api/overview") as resp:
                        routers = (await resp.json())["http"]["routers"]
                    if routers["total"] - baseline >= n and not routers.get("errors"):
                        return Served(time.perf_counter() - started, await client.revision() - revision,
                                      cpu_seconds(traefik.proc.pid) - traefik_cpu, cpu_seconds(proc.pid) - daemon_cpu)
                    await asyncio.sleep(0.02)
        finally:
            proc.terminate()
            proc.wait(30)
            traefik.stop()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ingresses", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=["latency", "throughput", "served"], help="run one part only")
    args = parser.parse_args()

    for in_place in (10, args.ingresses) if args.only in (None, "latency") else ():
        measured = [await latency(in_place) for _ in range(args.runs)]
        p50, p99 = median([pct(r.pushes, 0.5) for r in measured]), median([pct(r.pushes, 0.99) for r in measured])
        rtt, rtt99 = median([median(r.bare) for r in measured]), median([pct(r.bare, 0.99) for r in measured])
        relay50, relay99 = median([pct(r.relay, 0.5) for r in measured]), median([pct(r.relay, 0.99) for r in measured])
        print(f"push-to-commit with {in_place} in place: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms; "
              f"bare txn round trip {rtt * 1000:.2f} ms (p99 {rtt99 * 1000:.2f}); p99/rtt {p99 / rtt:.1f} (target <= 3)")
        print(f"  floor, a relay answering after one bare txn: p50 {relay50 * 1000:.1f} ms, p99 {relay99 * 1000:.1f} ms "
              f"(p99/rtt {relay99 / rtt:.1f}); exporter p99 / relay p99 {p99 / relay99:.1f}")

    rates, raws = [], []
    per = 0
    for _ in range(args.runs if args.only in (None, "throughput") else 0):
        rate, raw, per = await throughput()
        rates.append(rate)
        raws.append(raw)
    if rates:
        print(f"50 concurrent clients: {median(rates):.0f} upserts/s (target >= 1000) = {median(rates) * per:.0f} keys/s, "
              f"{median(rates) * per / median(raws):.0%} of raw etcd {median(raws):.0f} keys/s ({per} keys per ingress)")

    for per_request, target in ((1, 3.0), (100, 1.5)) if args.only in (None, "served") else ():
        runs = [await push_to_served(per_request=per_request) for _ in range(args.runs)]
        print(f"push-to-served: 1000 new ingresses, {per_request} per request, 10 clients: all served by Traefik "
              f"{median([r.seconds for r in runs]):.2f}s after the first push (target <= {target}; runs "
              + ", ".join(f"{r.seconds:.2f}" for r in runs) + f"); {median([r.revisions for r in runs]):.0f} etcd revisions, "
              f"Traefik CPU {median([r.traefik_cpu for r in runs]):.2f}s, daemon CPU {median([r.daemon_cpu for r in runs]):.2f}s")


if __name__ == "__main__":
    asyncio.run(main())
