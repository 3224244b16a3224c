"""The status page at 10,000 ingresses: time to first byte of `/` and of the ingress table page.

A daemon process next to a real Traefik (observing it) holds `--ingresses` ingresses (one
authority, two servers each). Once Traefik serves them, each page is fetched `--samples` times;
reported: the median time to the first byte and to the whole page, against `/healthz` measured
in the same run (the floor of any answer from the control server).

Targets: `/` first byte < 300 ms, the table page (`/ui/ingresses?q=...` and page 2) < 500 ms.

Usage: .venv/bin/python -m bench.status_page [--ingresses 10000] [--samples 5]
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.common import fresh_etcd, put_in_place
from bench.harness import arguments, median, start_daemon, wait_up
from bench.served import converged
from exporter.embedded import start_traefik

ROOT = "traefik/worker_bench"
PAGES = {"healthz": "/healthz", "page /": "/", "table page 2": "/ui/ingresses?page=2", "search": "/ui/ingresses?q=i7345.example",
         "state.json": "/ui/state.json"}


async def _timed(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    started = time.perf_counter()
    async with session.get(url) as resp:
        first = time.perf_counter() - started
        await resp.read()
        resp.raise_for_status()
    return first, time.perf_counter() - started


async def main() -> None:
    parser = arguments(__doc__, runs=None)
    parser.add_argument("--ingresses", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        traefik = start_traefik(Path(tmp), etcd.url, ROOT, ["web"])
        proc, base, control = start_daemon(etcd.url, Path(tmp), EXPORTER_TRAEFIK__API_URL=traefik.api)
        try:
            async with aiohttp.ClientSession() as session:
                await wait_up(session, base)
                await put_in_place(session, base, args.ingresses)
                await converged(session, control)
                for name, path in PAGES.items():
                    runs = [await _timed(session, control + path) for _ in range(args.samples)]
                    print(f"{args.ingresses} ingresses, {name}: first byte {median([r[0] for r in runs]) * 1000:.1f} ms, "
                          f"whole {median([r[1] for r in runs]) * 1000:.1f} ms (median of {args.samples})", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
            traefik.stop()


if __name__ == "__main__":
    asyncio.run(main())
