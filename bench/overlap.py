"""Roots that are string prefixes of each other: what writes under one cost the other's Traefik.

A Traefik on root `traefik/worker_1` with N routers in place (default 2,000); then 10 single-key
writes, 300 ms apart (each its own Traefik reload after the 100 ms throttle), under
`traefik/worker_10/` (a root it matches as a string prefix), under `traefik/worker_2/` (one it does
not), and under `traefik/worker_10/kv/` with both roots given a segment after the authority
(`traefik/worker_{authority}/kv`). Printed: that Traefik's CPU seconds over each series, against the
same time idle in the same run. Medians of `--runs`.

Usage: .venv/bin/python -m bench.overlap [--routers 2000] [--runs 3]
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.common import exporter_keys, fresh_etcd, make_records, raw_write
from bench.harness import arguments, cpu_seconds, median
from exporter.embedded import EmbeddedTraefik, start_traefik
from exporter.etcd.client import EtcdClient

WRITES = 10
APART = 0.3
SETTLE = 3.0


async def _routers(traefik: EmbeddedTraefik) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"{traefik.api}/api/overview") as resp:
        return int((await resp.json())["http"]["routers"]["total"])


async def _series(client: EtcdClient, traefik: EmbeddedTraefik, prefix: str | None) -> float:
    """Traefik's CPU seconds over WRITES writes under `prefix` (None: the same time idle), and a settle."""
    before = cpu_seconds(traefik.proc.pid)
    for n in range(WRITES):
        if prefix is not None:
            await client.put(f"{prefix}http/routers/other_{n}/service", "other")
        await asyncio.sleep(APART)  # pacing the writes: each is its own reload
    await asyncio.sleep(SETTLE)
    return cpu_seconds(traefik.proc.pid) - before


async def run(routers: int, suffix: str) -> dict[str, float]:
    """One run: a Traefik on `traefik/worker_1<suffix>` with `routers` in place, each series measured."""
    root = f"traefik/worker_1{suffix}"
    records = make_records(routers, authority="1")
    keys = [(k.replace("traefik/worker_1/", f"{root}/", 1), v) for k, v in exporter_keys(records)]
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        await raw_write(etcd.url, keys, 8)
        traefik = start_traefik(Path(tmp), etcd.url, root, ["web"])
        try:
            deadline = time.monotonic() + 120
            while await _routers(traefik) < routers:
                if time.monotonic() > deadline:
                    raise RuntimeError("Traefik did not list the routers in place")
                await asyncio.sleep(0.2)
            await asyncio.sleep(SETTLE)  # its own rebuilds are over
            async with EtcdClient([etcd.url]) as client:
                return {
                    "idle": await _series(client, traefik, None),
                    "prefix": await _series(client, traefik, f"traefik/worker_10{suffix}/"),
                    "other": await _series(client, traefik, f"traefik/worker_2{suffix}/"),
                }
        finally:
            traefik.stop()


async def main() -> None:
    parser = arguments(__doc__, runs=3)
    parser.add_argument("--routers", type=int, default=2000)
    args = parser.parse_args()
    for suffix, label in (("", "rootKey traefik/worker_1"), ("/kv", "rootKey traefik/worker_1/kv")):
        runs = [await run(args.routers, suffix) for _ in range(args.runs)]
        idle, prefix, other = (median([r[k] for r in runs]) for k in ("idle", "prefix", "other"))
        print(f"{label}, {args.routers} routers: Traefik CPU over {WRITES} writes under worker_10{suffix}/ {prefix:.2f}s, "
              f"under worker_2{suffix}/ {other:.2f}s, idle {idle:.2f}s (medians of {args.runs})")


if __name__ == "__main__":
    asyncio.run(main())
