"""Failover: leader SIGKILL to the first leader-only write by its successor, median of runs.

Three sidecars share one root; an ingress is health-checked against a backend that is killed
right after the leader, so the successor's first leader-only write is that ejection.
Usage: .venv/bin/python -m bench.failover [--runs 5] [--ttl 10]
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.common import fresh_etcd
from bench.harness import arguments, median
from exporter.embedded import free_port
from exporter.etcd.client import EtcdClient

TOKEN = "bench-token"
BACKEND = """
import asyncio, sys
from aiohttp import web
async def ok(request): return web.Response(text="ok")
async def main():
    app = web.Application(); app.router.add_get("/{t:.*}", ok)
    runner = web.AppRunner(app); await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", int(sys.argv[1])).start()
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def one_run(ttl: int) -> float:
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "exporter.yaml").write_text(f'etcd: {{endpoints: ["{etcd.url}"]}}\nleader: {{ttl: {ttl}}}\n')
        procs, apis = [], []
        for _ in range(3):
            api = f"127.0.0.1:{free_port()}"
            env = {**os.environ, "EXPORTER_API__TOKEN": TOKEN, "EXPORTER_API__LISTEN": api,
                   "EXPORTER_CONTROL__LISTEN": f"127.0.0.1:{free_port()}", "EXPORTER_LOG__LEVEL": "WARNING"}
            procs.append(subprocess.Popen([sys.executable, "-m", "exporter", "run", "--config", str(work / "exporter.yaml")],
                                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            apis.append(api)
        port = free_port()
        backend = subprocess.Popen([sys.executable, "-c", BACKEND, str(port)])
        try:
            async with EtcdClient([etcd.url]) as client, aiohttp.ClientSession() as http:
                body = {"ingresses": [{"authority": "bench", "id": "fo", "revision": 1, "hosts": ["fo.test"],
                                       "upstream": {"servers": [{"url": f"http://127.0.0.1:{port}"}, {"url": f"http://127.0.0.1:{free_port()}"}]},
                                       "health_check": {"enable": True, "interval": 0.2, "max_retries": 2, "max_wait_time": 0.5,
                                                        "initial_delay": 0}}]}
                while True:
                    try:
                        async with http.post(f"http://{apis[0]}/v2/ingress/upsert", json=body,
                                             headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                            if resp.status == 204:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.2)
                key = "traefik/worker_bench/http/services/bench_fo/loadBalancer/servers/000/url"
                while (await client.get(key)) is None:
                    await asyncio.sleep(0.05)
                election = await client.get("traefik-etcd-exporter/records.leader")
                while election is None:
                    await asyncio.sleep(0.05)
                    election = await client.get("traefik-etcd-exporter/records.leader")
                leader_pid = int(election.value.split(":")[1])
                leader = next(p for p in procs if p.pid == leader_pid)
                leader.send_signal(signal.SIGKILL)
                killed = time.monotonic()
                backend.kill()
                while (await client.get(key)) is not None:
                    await asyncio.sleep(0.02)
                return time.monotonic() - killed
        finally:
            backend.kill()
            for p in procs:
                p.kill()
                p.wait()


async def main() -> None:
    parser = arguments(__doc__, runs=5)
    parser.add_argument("--ttl", type=int, default=10)
    args = parser.parse_args()
    times = [await one_run(args.ttl) for _ in range(args.runs)]
    print(f"failover (leader SIGKILL -> successor's first leader-only write), TTL {args.ttl}s: median {median(times):.2f}s "
          f"over {args.runs} runs (min {min(times):.2f}, max {max(times):.2f}); bound TTL + 1 = {args.ttl + 1}s")


if __name__ == "__main__":
    asyncio.run(main())
