"""Push API benchmarks (issue 4), against a daemon process, with raw etcd baselines from the same run.

1. Push-to-commit latency (p50, p99) of single-ingress upserts with 10 and with N ingresses in
   place, against one bare etcd txn round trip. Target: p99 <= 2x the round trip, flat in N.
2. Upserts per second from 50 concurrent clients, also as a fraction of the raw etcd key
   throughput (bare 128-op txns, 8 in flight). Target: >= 1,000/s.
3. Push-to-served: 1,000 new ingresses pushed as fast as possible, until Traefik routes all.

Usage: .venv/bin/python bench/push_api.py [--ingresses 10000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
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
from exporter.embedded import start_traefik  # noqa: E402


async def latency(in_place: int, samples: int = 200) -> tuple[list[float], list[float]]:
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
            rtt = await txn_round_trip(etcd.url, samples)
            return out, rtt
        finally:
            proc.terminate()
            proc.wait(30)


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


async def push_to_served(n: int = 1000, clients: int = 50) -> float:
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        traefik = start_traefik(Path(tmp), etcd.url, "traefik/worker_bench", ["web"])
        proc, base, _control = start_daemon(etcd.url, Path(tmp))
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
                await wait_up(session, base)
                async with session.get(f"{traefik.api}/api/overview") as resp:
                    baseline = (await resp.json())["http"]["routers"]["total"]
                records = make_records(n)

                async def client(k: int) -> None:
                    for r in records[k::clients]:
                        await upsert(session, base, [r])

                started = time.perf_counter()
                await asyncio.gather(*(client(k) for k in range(clients)))
                while True:
                    async with session.get(f"{traefik.api}/api/overview") as resp:
                        routers = (await resp.json())["http"]["routers"]
                    if routers["total"] - baseline >= n and not routers.get("errors"):
                        return time.perf_counter() - started
                    await asyncio.sleep(0.02)
        finally:
            proc.terminate()
            proc.wait(30)
            traefik.stop()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ingresses", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    for in_place in (10, args.ingresses):
        p50s: list[float] = []
        p99s: list[float] = []
        rtts: list[float] = []
        for _ in range(args.runs):
            lat, rtt = await latency(in_place)
            p50s.append(pct(lat, 0.5))
            p99s.append(pct(lat, 0.99))
            rtts.append(median(rtt))
        p50, p99, rtt_median = median(p50s), median(p99s), median(rtts)
        print(f"push-to-commit with {in_place} in place: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms; "
              f"bare txn round trip {rtt_median * 1000:.2f} ms; p99/rtt {p99 / rtt_median:.1f} (target <= 2)")

    rates, raws = [], []
    per = 0
    for _ in range(args.runs):
        rate, raw, per = await throughput()
        rates.append(rate)
        raws.append(raw)
    print(f"50 concurrent clients: {median(rates):.0f} upserts/s (target >= 1000) = {median(rates) * per:.0f} keys/s, "
          f"{median(rates) * per / median(raws):.0%} of raw etcd {median(raws):.0f} keys/s ({per} keys per ingress)")

    served = median([await push_to_served() for _ in range(args.runs)])
    print(f"push-to-served: 1000 new ingresses answered by Traefik {served:.2f}s after the first push")


if __name__ == "__main__":
    asyncio.run(main())
