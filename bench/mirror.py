"""The mirror: what a bulk sync with the watch running costs, a conflict's retry, the /v1/mirror digest.

1. Bulk sync of N ingresses by an in-process reconciler into an empty etcd: wall seconds, this
   process's CPU and etcd's CPU. Run it from two trees in turn (`--against DIR`: the same module
   run from DIR's checkout, alternated with this one's) to compare a watch that keeps running
   through the bulk with one paused for it.
2. Conflict to retried commit: two reconcilers on one etcd; A pushes revision 3 of an ingress, and
   just before A's transaction reaches etcd, B commits revision 2. A's compare fails; the time
   from that failed reply to A's retried commit is what A spends learning why (re-reading etcd,
   or waiting for its watch), judging and planning again.
3. `--digest`: the SHA-256 digest of `GET /v1/mirror` over a mirror holding N ingresses.

Usage: .venv/bin/python -m bench.mirror [--ingresses 10000] [--runs 3] [--against DIR] [--samples 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from loguru import logger

from bench.common import fresh_etcd, make_records
from bench.harness import arguments, cpu_seconds, median, pct
from exporter.assembly import build_reconciler
from exporter.config import Settings
from exporter.embedded import EmbeddedEtcd
from exporter.etcd.client import EtcdClient
from exporter.etcd.types import Compare, Op, TxnResult
from exporter.gc_tuning import tune_gc
from exporter.reconcile import Reconciler

IN_FLIGHT = 8


def _settings(url: str) -> Settings:
    return Settings.model_validate({"etcd": {"endpoints": [url]}, "writer": {"max_in_flight": IN_FLIGHT, "coalesce_window": 0.005}})


@asynccontextmanager
async def synced() -> AsyncIterator[tuple[EmbeddedEtcd, Reconciler]]:
    """A fresh etcd and a reconciler on it, synced; stopped afterwards."""
    with fresh_etcd() as etcd:
        async with EtcdClient([etcd.url]) as client:
            rec = build_reconciler(_settings(etcd.url), client)
            await rec.start()
            await rec.wait_synced(30)
            yield etcd, rec
            await rec.stop()


async def bulk(n: int) -> tuple[float, float, float]:
    """(wall s, this process's CPU s, etcd's CPU s) of a bulk sync of `n` ingresses into an empty etcd."""
    records = make_records(n)
    async with synced() as (etcd, rec):
        etcd_cpu, cpu, started = cpu_seconds(etcd.proc.pid), time.process_time(), time.perf_counter()
        await asyncio.gather(*(rec.submit(records[i : i + 1000]) for i in range(0, n, 1000)))
        wall = time.perf_counter() - started
        return wall, time.process_time() - cpu, cpu_seconds(etcd.proc.pid) - etcd_cpu


class _Interposed:
    """A's etcd client: before the first transaction that writes `key`, `first` runs (B's commit)."""

    def __init__(self, inner: EtcdClient, key: str) -> None:
        self._inner, self.key = inner, key
        self.first: Any = None
        self.failed_at = 0.0
        self.retried_at = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        ours = any(op.key == self.key for op in ops)
        if ours and self.first is not None:
            first, self.first = self.first, None
            await first()
        reply = await self._inner.txn(compares, ops)
        if ours and not reply.succeeded and not self.failed_at:
            self.failed_at = time.perf_counter()
        elif ours and reply.succeeded and self.failed_at and not self.retried_at:
            self.retried_at = time.perf_counter()
        return reply


async def conflicts(samples: int) -> list[float]:
    """Seconds from A's failed compare to A's retried commit, one per sample."""
    out = []
    with fresh_etcd() as etcd:
        async with EtcdClient([etcd.url]) as client_a, EtcdClient([etcd.url]) as client_b:
            a_etcd = _Interposed(client_a, "")
            a: Reconciler = build_reconciler(_settings(etcd.url), a_etcd)
            b = build_reconciler(_settings(etcd.url), client_b)
            layout = _settings(etcd.url).layout()
            for rec in (a, b):
                await rec.start()
                await rec.wait_synced(30)
            for s in range(samples):
                (first,) = make_records(1, authority=f"c{s}")
                await a.submit([first])
                (newer,) = make_records(1, authority=f"c{s}", revision=3, port=9001)
                (between,) = make_records(1, authority=f"c{s}", revision=2, port=9002)
                a_etcd.key = layout.record_key(first.key)
                a_etcd.failed_at = a_etcd.retried_at = 0.0

                async def b_commits(between: Any = between) -> None:
                    await b.submit([between])

                a_etcd.first = b_commits
                await a.submit([newer])
                if a_etcd.failed_at and a_etcd.retried_at:  # else B's commit landed before A planned: no conflict
                    out.append(a_etcd.retried_at - a_etcd.failed_at)
            for rec in (a, b):
                await rec.stop()
    return out


async def digest(n: int, runs: int) -> None:
    records = make_records(n)
    async with synced() as (_etcd, rec):
        await asyncio.gather(*(rec.submit(records[i : i + 1000]) for i in range(0, n, 1000)))
        took = []
        for run in range(max(runs, 5)):
            await rec.submit(make_records(1, revision=2 + run, port=9000 + run))  # a new revision: no digest kept
            started = time.perf_counter()
            summary = rec.mirror_summary()
            took.append(time.perf_counter() - started)
        print(f"GET /v1/mirror over {summary.keys} keys ({n} ingresses): digest {median(took) * 1000:.0f} ms at a new revision "
              f"(median of {len(took)}; the event loop is busy that long, then the digest is kept until R moves)")


def _run_against(directory: str, args: list[str]) -> str:
    """This module's output when run from another checkout (its `exporter` package)."""
    done = subprocess.run([sys.executable, "-m", "bench.mirror", *args], cwd=directory, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": directory})
    if done.returncode:
        raise RuntimeError(f"bench.mirror in {directory} failed:\n{done.stderr[-3000:]}")
    return done.stdout


async def main() -> None:
    parser = arguments(__doc__, runs=3)
    parser.add_argument("--ingresses", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--against", help="a checkout of another tree: its bulk and conflicts, alternated with this one's")
    parser.add_argument("--only", choices=["bulk", "conflict", "digest"])
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logger.remove()
    tune_gc()
    if args.one:  # one run of one measure, printed for the caller
        if args.only == "bulk":
            print(*await bulk(args.ingresses))
        else:
            print(*await conflicts(args.samples))
        return
    if args.only == "digest":
        await digest(args.ingresses, args.runs)
        return
    trees = {"this tree": str(Path(__file__).resolve().parent.parent)}
    if args.against:
        trees["against"] = args.against
    for measure in ("bulk", "conflict"):
        if args.only and args.only != measure:
            continue
        found: dict[str, list[list[float]]] = {name: [] for name in trees}
        for _ in range(args.runs):
            for name, directory in trees.items():  # alternated, run after run
                out = _run_against(directory, ["--one", "--only", measure, "--ingresses", str(args.ingresses),
                                               "--samples", str(args.samples)])
                found[name].append([float(x) for x in out.split()])
        for name, runs in found.items():
            if measure == "bulk":
                wall, cpu, etcd_cpu = (median([r[i] for r in runs]) for i in range(3))
                print(f"bulk sync of {args.ingresses}, {name}: {wall:.2f} s wall, daemon CPU {cpu:.2f} s, etcd CPU {etcd_cpu:.2f} s "
                      f"(medians of {args.runs})")
            else:
                every = [x for r in runs for x in r]
                print(f"conflict to retried commit, {name}: p50 {pct(every, 0.5) * 1000:.1f} ms, p99 {pct(every, 0.99) * 1000:.1f} ms "
                      f"({len(every)} conflicts)")
        if len(found) == 2 and measure == "bulk":
            this, other = (median([r[0] for r in found[k]]) for k in trees)
            print(f"  wall ratio this / against: {this / other:.2f}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    asyncio.run(main())
