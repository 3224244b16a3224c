"""Passive-health benchmarks.

1. Access-log throughput on one core: Traefik JSON lines appended to a file, read by the
   follower, classified and counted (`LogFollower` + `classify` + `PassiveHealth.observe`),
   against a bare `json.loads` of the same lines in the same run. Target >= 20,000 lines/s.
2. Delay from the `max_failures`-th failed request to Traefik serving the ejection: a daemon
   process with passive health next to a real Traefik writing its access log, a server that
   answers 502 beside one that answers 200; requests one after another until no request
   reaches the bad server any more. Baseline in the same run: a server removed by a bare etcd
   transaction until Traefik stops sending to it (the floor any writer pays: Traefik's reload).

Usage: .venv/bin/python -m bench.passive [--runs 3] [--lines 200000] [--samples 5]
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.common import fresh_etcd
from bench.harness import HEADERS, arguments, median, start_daemon, wait_up
from exporter.embedded import EmbeddedTraefik, free_port, start_traefik
from exporter.etcd.client import EtcdClient
from exporter.etcd.types import Op
from exporter.health.accesslog import LogFollower, classify
from exporter.health.passive import PassiveHealth, PassivePolicy
from exporter.keys import IngressRef, KeyLayout

ROOT = "traefik/worker_bench"


def log_lines(n: int, ingresses: int = 1000) -> list[bytes]:
    """`n` access-log lines as Traefik 3.7 writes them, over `ingresses` services; one in ten a 502."""
    out = []
    for i in range(n):
        k = i % ingresses
        status = 502 if i % 10 == 0 else 200
        url = f"http://10.0.{k // 250}.{k % 250}:8000"
        out.append(json.dumps({
            "ClientAddr": "127.0.0.1:40000", "ClientHost": "127.0.0.1", "ClientPort": "40000", "ClientUsername": "-",
            "DownstreamContentSize": 11, "DownstreamStatus": status, "Duration": 259254, "OriginContentSize": 11,
            "OriginDuration": 204520, "OriginStatus": status, "Overhead": 54734, "RequestAddr": f"i{k}.example.test",
            "RequestContentSize": 0, "RequestCount": i, "RequestHost": f"i{k}.example.test", "RequestMethod": "POST",
            "RequestPath": "/v1/chat/completions", "RequestPort": "-", "RequestProtocol": "HTTP/1.1", "RequestScheme": "http",
            "RetryAttempts": 0, "RouterName": f"bench_i{k}@etcd", "ServiceAddr": url[7:], "ServiceName": f"bench_i{k}@etcd",
            "ServiceURL": url, "StartLocal": "2026-11-30T23:37:02.637868029Z", "StartUTC": "2026-11-30T23:37:02.637868029Z",
            "entryPointName": "web", "level": "info", "msg": "", "time": "2026-11-30T23:37:02Z",
        }).encode())
    return out


def throughput(lines: list[bytes]) -> tuple[float, float]:
    """(lines/s through follower + classify + observe, lines/s of bare json.loads) over the same lines."""
    known = {IngressRef("bench", f"i{k}"): frozenset({f"http://10.0.{k // 250}.{k % 250}:8000"}) for k in range(1000)}
    passive = PassiveHealth(PassivePolicy(max_failures=10**9), KeyLayout())
    with tempfile.TemporaryDirectory(prefix="bench-log-") as tmp:
        path = Path(tmp) / "access.json"
        path.write_bytes(b"")
        follower = LogFollower(path)
        follower.open_at_end()
        path.write_bytes(b"\n".join(lines) + b"\n")
        started = time.perf_counter()
        seen = 0
        while seen < len(lines):
            batch = follower.read_available()
            seen += len(batch)
            requests = [r for line in batch if (r := classify(line, frozenset({502, 503, 504}))) is not None]
            passive.observe(requests, lambda owner: known.get(owner, frozenset()), 0.0)
        ours = len(lines) / (time.perf_counter() - started)
        follower.close()
    started = time.perf_counter()
    for line in lines:
        json.loads(line)
    bare = len(lines) / (time.perf_counter() - started)
    return ours, bare


class Upstream:
    """One backend answering `status` to everything, counting requests."""

    def __init__(self, status: int) -> None:
        self.status, self.hits, self.port = status, 0, free_port()

    async def start(self) -> web.AppRunner:
        async def handle(request: web.Request) -> web.Response:
            self.hits += 1
            return web.Response(status=self.status, text=str(self.status))

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        return runner

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def until_bad_unreached(session: aiohttp.ClientSession, traefik: EmbeddedTraefik, host: str, bad: Upstream,
                              after_hits: int) -> float:
    """Requests one after another; the time of the first request after which the bad server got none of 30 more."""
    clean_since: float | None = None
    clean = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        before = bad.hits
        sent = time.perf_counter()
        async with session.get(traefik.url("web") + "/", headers={"Host": host}) as resp:
            await resp.read()
        if bad.hits == before and bad.hits >= after_hits:
            clean_since = clean_since or sent
            clean += 1
            if clean >= 30:
                return clean_since
        else:
            clean_since, clean = None, 0
    raise RuntimeError("the bad server kept getting traffic")


async def ejection_delay(samples: int) -> tuple[list[float], list[float]]:
    """Seconds from the max_failures-th failure to the ejection served, and from a bare removal to it being served."""
    delays, bare = [], []
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory(prefix="bench-passive-") as tmp:
        work = Path(tmp)
        log = work / "access.json"
        traefik = start_traefik(work, etcd.url, ROOT, ["web"], extra_args=[f"--accessLog.filePath={log}", "--accessLog.format=json"])
        proc, api, _control = start_daemon(etcd.url, work, EXPORTER_HEALTH__PASSIVE__ACCESS_LOG=str(log),
                                           EXPORTER_TRAEFIK__API_URL=traefik.api,
                                           EXPORTER_HEALTH__PASSIVE__BASE_EJECTION_TIME="300")
        bad, good = Upstream(502), Upstream(200)
        runners = [await bad.start(), await good.start()]
        client = EtcdClient([etcd.url])
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                await wait_up(session, api)
                for i in range(samples):
                    delays.append(await _one_ejection(session, traefik, api, bad, good, f"p{i}"))
                    bare.append(await _one_bare_removal(session, client, traefik, bad, good, f"b{i}"))
        finally:
            await client.close()
            proc.terminate()
            proc.wait(30)
            traefik.stop()
            for runner in runners:
                await runner.cleanup()
    return delays, bare


async def _one_ejection(session: aiohttp.ClientSession, traefik: EmbeddedTraefik, api: str, bad: Upstream,
                        good: Upstream, iid: str) -> float:
    ingress = {"authority": "bench", "id": iid, "revision": 1, "hosts": [f"{iid}.test"],
               "upstream": {"servers": [{"url": bad.url}, {"url": good.url}]}}
    async with session.post(f"{api}/v2/ingress/upsert?wait=served", headers=HEADERS, json={"ingresses": [ingress]}) as resp:
        assert resp.status == 204, await resp.text()
    start_hits = bad.hits
    fifth: float | None = None
    while fifth is None:
        async with session.get(traefik.url("web") + "/", headers={"Host": f"{iid}.test"}) as resp:
            await resp.read()
        if bad.hits - start_hits >= 5:
            fifth = time.perf_counter()
    return await until_bad_unreached(session, traefik, f"{iid}.test", bad, 0) - fifth


async def _one_bare_removal(session: aiohttp.ClientSession, client: EtcdClient, traefik: EmbeddedTraefik,
                            bad: Upstream, good: Upstream, name: str) -> float:
    base = f"{ROOT}/http"
    servers = f"{base}/services/{name}/loadBalancer/servers"
    await client.txn([], [Op(f"{base}/routers/{name}/rule", f"Host(`{name}.test`)"), Op(f"{base}/routers/{name}/service", name),
                          Op(f"{servers}/0/url", good.url), Op(f"{servers}/1/url", bad.url)])
    while True:  # until both are served
        before = bad.hits
        async with session.get(traefik.url("web") + "/", headers={"Host": f"{name}.test"}) as resp:
            await resp.read()
        if resp.status in (200, 502) and bad.hits > before:
            break
    removed = time.perf_counter()
    await client.txn([], [Op(f"{servers}/1/url", None)])
    return await until_bad_unreached(session, traefik, f"{name}.test", bad, 0) - removed


def main() -> None:
    parser = arguments(__doc__, runs=3)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    lines = log_lines(args.lines)
    rates = [throughput(lines) for _ in range(args.runs)]
    ours, bare = median([r[0] for r in rates]), median([r[1] for r in rates])
    print(f"access log: {ours:,.0f} lines/s read+classified+counted vs {bare:,.0f} lines/s bare json.loads "
          f"(ratio {bare / ours:.2f}x; target >= 20,000 lines/s)")
    results: list[dict[str, Any]] = []
    for _ in range(args.runs):
        delays, bare_removals = asyncio.run(ejection_delay(args.samples))
        results.append({"delay": median(delays), "bare": median(bare_removals)})
    d, b = median([r["delay"] for r in results]), median([r["bare"] for r in results])
    print(f"failure -> ejection served: median {d * 1000:.0f} ms vs bare etcd removal -> served {b * 1000:.0f} ms "
          f"(ratio {d / b:.2f}); per run: " + ", ".join(f"{r['delay'] * 1000:.0f}/{r['bare'] * 1000:.0f}" for r in results))


if __name__ == "__main__":
    main()
