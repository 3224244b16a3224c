"""Push-to-served benchmarks, against a daemon process next to a real Traefik.

1. Latency of `?wait=served` upserts (204 once Traefik serves them) against plain upserts
   (204 once committed) in the same run, with 1 and with 100 ingresses per request: p50, p99.
   Pushes are 150 ms apart, like lone pushes (closer ones wait for Traefik's 100 ms throttle).
2. The observer's request rate to Traefik while idle and during a burst of pushes, with 100
   and with 10,000 ingresses in place. It must not grow with the number of ingresses.

Usage: .venv/bin/python -m bench.served [--runs 3] [--ingresses 10000]
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.common import fresh_etcd, make_records, put_in_place, upsert
from bench.harness import arguments, median, pct, start_daemon, wait_up
from exporter.embedded import start_traefik

ROOT = "traefik/worker_bench"


async def _requests(session: aiohttp.ClientSession, control: str) -> float:
    async with session.get(f"{control}/metrics") as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("exporter_traefik_requests_total{"))


async def converged(session: aiohttp.ClientSession, control: str, timeout: float = 600) -> None:
    """Until the daemon says its Traefik serves everything committed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async with session.get(f"{control}/v1/convergence") as resp:
            roots = (await resp.json())["roots"]
        if roots and all(r["state"] == "converged" for r in roots):
            return
        await asyncio.sleep(0.2)
    raise RuntimeError("Traefik did not converge")


async def one_run(in_place: int, samples: int) -> dict[str, float]:
    """Latencies and observer request rates of one fresh etcd + Traefik + daemon."""
    out: dict[str, float] = {}
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        traefik = start_traefik(Path(tmp), etcd.url, ROOT, ["web"])
        # A Traefik holding 10,000 routers takes seconds per reload: served_timeout leaves room for it.
        proc, base, control = start_daemon(
            etcd.url, Path(tmp), EXPORTER_TRAEFIK__API_URL=traefik.api, EXPORTER_API__SERVED_TIMEOUT="120"
        )
        try:
            async with aiohttp.ClientSession() as session:
                await wait_up(session, base)
                await put_in_place(session, base, in_place)
                await converged(session, control)
                revisions = itertools.count(2)
                for per_request in (1, 100):
                    commit: list[float] = []
                    served: list[float] = []
                    for s in range(samples):
                        for query, into in (("", commit), ("?wait=served", served)):
                            # Apart by more than Traefik's throttle (100 ms), as lone pushes are: the
                            # throttle applies the first change after a quiet period at once.
                            await asyncio.sleep(0.15)
                            change = make_records(per_request, revision=next(revisions), port=9000 + s % 1000)
                            started = time.perf_counter()
                            await upsert(session, base, change, query)
                            into.append(time.perf_counter() - started)
                    for name, values in (("commit", commit), ("served", served)):
                        out[f"{name} {per_request} p50"] = pct(values, 0.5)
                        out[f"{name} {per_request} p99"] = pct(values, 0.99)
                before, started = await _requests(session, control), time.perf_counter()
                await asyncio.sleep(5)
                out["idle req/s"] = (await _requests(session, control) - before) / (time.perf_counter() - started)
                before, started = await _requests(session, control), time.perf_counter()
                for s in range(200):
                    await upsert(session, base, make_records(1, revision=next(revisions), port=7000 + s))
                out["busy req/s"] = (await _requests(session, control) - before) / (time.perf_counter() - started)
        finally:
            proc.terminate()
            proc.wait(30)
            traefik.stop()
    return out


async def main() -> None:
    parser = arguments(__doc__, runs=3)
    parser.add_argument("--ingresses", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    for in_place in (100, args.ingresses):
        runs = [await one_run(in_place, args.samples) for _ in range(args.runs)]
        m = {key: median([r[key] for r in runs]) for key in runs[0]}
        for n in (1, 100):
            print(f"{in_place} in place, {n} per request: push-to-commit p50 {m[f'commit {n} p50'] * 1000:.1f} ms "
                  f"p99 {m[f'commit {n} p99'] * 1000:.1f} ms; push-to-served (?wait=served) "
                  f"p50 {m[f'served {n} p50'] * 1000:.1f} ms p99 {m[f'served {n} p99'] * 1000:.1f} ms "
                  f"(served/commit p50 {m[f'served {n} p50'] / m[f'commit {n} p50']:.1f}x)")
        print(f"{in_place} in place: observer requests to Traefik {m['idle req/s']:.1f}/s idle, "
              f"{m['busy req/s']:.1f}/s during 200 single pushes")


if __name__ == "__main__":
    asyncio.run(main())
