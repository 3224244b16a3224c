"""A daemon's start with N ingresses already in etcd: what a Kubernetes startup probe must wait for.

etcd holds N ingresses (records and keys, as the exporter wrote them). Each run starts a daemon
process on it and polls its `/healthz` and `/readyz` every 50 ms until it is ready (its first
sync done: records and keys listed, a full pass planned and found nothing to write). Printed,
medians of the runs: the time to the first `/healthz` 200 (what a startupProbe on it waits for),
to `/readyz` 200, and the slowest `/healthz` answer while the first sync ran (what a liveness
probe's timeout must allow), against the baseline of the same run: reading the same two
prefixes with a bare paged range read.

Usage: .venv/bin/python -m bench.first_sync [--ingresses 10000] [--runs 3]
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import aiohttp
from loguru import logger

from bench.bulk_sync import _settings, submit_all
from bench.common import RECORDS, fresh_etcd, make_records
from bench.harness import arguments, median, start_daemon
from exporter.assembly import build_reconciler
from exporter.etcd.client import EtcdClient


async def _seed(url: str, n: int) -> None:
    async with EtcdClient([url]) as client:
        rec = build_reconciler(_settings(url), client)
        await rec.start()
        await rec.wait_synced(30)
        await submit_all(rec, make_records(n))
        await rec.stop()


async def _bare_read(url: str) -> float:
    async with EtcdClient([url]) as client:
        started = time.perf_counter()
        for prefix in (RECORDS + "/", "traefik/"):
            await client.range_prefix(prefix)
        return time.perf_counter() - started


async def _answer(session: aiohttp.ClientSession, url: str) -> tuple[int, float]:
    started = time.perf_counter()
    try:
        async with session.get(url) as resp:
            await resp.read()
            return resp.status, time.perf_counter() - started
    except (aiohttp.ClientError, TimeoutError):
        return 0, time.perf_counter() - started


async def _start(url: str, work: Path) -> tuple[float, float, float]:
    """(seconds to /healthz 200, to /readyz 200, slowest /healthz answer until ready)."""
    started = time.perf_counter()
    proc, _api, control = start_daemon(url, work)
    alive = ready = slowest = 0.0
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            while time.perf_counter() - started < 300:
                status, took = await _answer(session, f"{control}/healthz")
                if status == 200:
                    alive = alive or time.perf_counter() - started
                    slowest = max(slowest, took)
                if alive and (await _answer(session, f"{control}/readyz"))[0] == 200:
                    ready = time.perf_counter() - started
                    break
                await asyncio.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(30)
    if not ready:
        raise RuntimeError(f"the daemon was not ready within 300 s (log: {work / 'daemon.log'})")
    return alive, ready, slowest


async def main(n: int, runs: int) -> None:
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory(prefix="bench-first-sync-") as tmp:
        await _seed(etcd.url, n)
        starts, bare = [], []
        for run in range(runs):
            bare.append(await _bare_read(etcd.url))
            starts.append(await _start(etcd.url, Path(tmp)))
            print(f"run {run + 1}: /healthz after {starts[-1][0]:.2f} s, /readyz after {starts[-1][1]:.2f} s, "
                  f"slowest /healthz {starts[-1][2] * 1000:.0f} ms; bare read {bare[-1]:.2f} s", flush=True)
        alive, ready, slowest = (median([s[i] for s in starts]) for i in range(3))
        print(f"{n} ingresses in etcd, medians of {runs}: /healthz 200 after {alive:.2f} s; /readyz 200 after {ready:.2f} s "
              f"= {ready / median(bare):.1f}x a bare read of the same keys ({median(bare):.2f} s); "
              f"slowest /healthz answer during the first sync {slowest * 1000:.0f} ms "
              f"(worst run {max(s[2] for s in starts) * 1000:.0f} ms)")


if __name__ == "__main__":
    parser = arguments(__doc__)
    parser.add_argument("--ingresses", type=int, default=10000)
    args = parser.parse_args()
    logger.remove()
    asyncio.run(main(args.ingresses, args.runs))
