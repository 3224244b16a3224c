"""Push API benchmarks, against a daemon process, with raw etcd baselines from the same run.

1. Push-to-commit latency (p50, p99) of single-ingress upserts with 10 and with N ingresses in
   place, against one bare etcd txn round trip. Target: p99 <= 3x the round trip, flat in N.
   Also the floor of any push in the same run: a relay that answers each request after one bare
   txn (bench/relay.py: the two HTTP hops, nothing else).
2. Upserts per second from 50 concurrent clients on kept connections, each pushing one ingress
   per request (new revisions of 1,000 ingresses in place), against the same 50 clients sending
   bare one-ingress transactions straight to etcd's gateway (the ingress's keys, its record and
   a beacon: what the exporter would write for it alone), and the same transactions sent over
   etcd's gRPC API (`grpc.aio`, one channel, requests serialized beforehand), with the CPU
   seconds of the daemon, etcd and the clients in each, and how much of the wall time the
   daemon's main thread (the event loop, where all its Python runs) was on a CPU. The sides take
   turns, one revision of every ingress at a time, so the machine's drift hits all alike. Targets: >= 1.2x the bare
   gateway writer and >= 0.85x the bare gRPC writer; etcd CPU per pushed ingress. `--against DIR`
   adds the daemon of another checkout (a worktree of an earlier commit) to the same slices: a
   before/after comparison at the same moments, on a machine whose speed moves between runs.
   The daemons log at WARNING unless `--log-level` says otherwise (`--against-log-level` for the
   other checkout's; `--against .` with two levels prices the daemon's default INFO, an access
   line per push, in the same slices).
   `--only floor`: the same runs, alternated, with the exporter replaced by bench/floor_server.py,
   a server that batches pushes alike and does only part of the exporter's work (only parsing
   the body; validating it into its record; also rendering and diffing it), against both bare
   writers: what the 50 clients could reach on this machine if the rest of the exporter cost nothing,
   and the CPU per push each stage adds (the exporter at `--log-level` too).
   `--only tracing`: the same slices, alternated, with the daemon exporting traces (`otel`) over OTLP/gRPC
   to a sink in this process at `sample_ratio` 1.0 and 0.01, against tracing disabled: the daemon's CPU per
   push of each, as a ratio to disabled in the same run (target at 1.0: <= 1.3x). `--against DIR` adds the
   disabled daemon of another checkout (the tree before tracing): no measurable change is the target.
3. Push-to-served: 1,000 new ingresses pushed by 10 closed-loop clients, one per request and 100
   per request, until Traefik routes all (targets 3 s and 1.5 s), with the etcd revisions used and
   the CPU seconds of Traefik and of the daemon in the same run.

Usage: .venv/bin/python -m bench.push_api [--ingresses 10000] [--runs 3] [--only latency|throughput|floor|served|tracing] [--against DIR]
       [--log-level LEVEL] [--against-log-level LEVEL]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import aiohttp
import grpc
import grpc.aio

from bench.common import (
    RECORDS,
    ROOT_KEY,
    exporter_keys,
    fresh_etcd,
    ingress_keys,
    make_records,
    put_in_place,
    raw_write,
    txn_round_trip,
    upsert,
)
from bench.floor_server import WORK
from bench.harness import HEADERS, arguments, median, pct, start_daemon, wait_up
from exporter.embedded import free_port, start_traefik
from exporter.etcd.client import EtcdClient
from exporter.etcd.proto import rpc_pb2
from exporter.etcd.types import Op, txn_body
from exporter.keys import KeyLayout
from exporter.store.records import Record

REPO = Path(__file__).resolve().parent.parent  # the benches run as modules from here


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
    relay = subprocess.Popen([sys.executable, "-m", "bench.relay", etcd_url, str(port)], cwd=REPO)
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


T = TypeVar("T")
Server = Callable[[str, Path], tuple[subprocess.Popen[bytes], str, str]]


def floor_server(work: str) -> Server:
    """Starts bench/floor_server.py doing `work` (like `start_daemon`: the process, its push API URL, no control URL)."""

    def start(etcd_url: str, _tmp: Path) -> tuple[subprocess.Popen[bytes], str, str]:
        listen = f"127.0.0.1:{free_port()}"
        return subprocess.Popen([sys.executable, "-m", "bench.floor_server", etcd_url, listen, work], cwd=REPO), f"http://{listen}", ""

    return start


@dataclass
class Throughput:
    """One 50-client run: requests per second and the CPU seconds each process spent."""

    rate: float
    daemon_cpu: float
    etcd_cpu: float
    clients_cpu: float
    p99: float
    requests: int
    main_busy: float = 0.0  # the share of the wall time the daemon's main thread was on a CPU


def _changes(in_place: int, per_ingress: int) -> list[list[Record]]:
    """Each round a new revision of every ingress in place (another server port: its keys change)."""
    return [make_records(in_place, revision=2 + n, port=9000 + n) for n in range(per_ingress)]


async def _closed_loop(clients: int, requests: list[T], send: Callable[[T], Awaitable[None]]) -> tuple[float, list[float]]:
    """`clients` closed-loop clients sending `requests` (client k takes every k-th); seconds taken, latencies."""
    latencies: list[float] = []

    async def client(k: int) -> None:
        for request in requests[k::clients]:
            started = time.perf_counter()
            await send(request)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    return time.perf_counter() - started, latencies


@dataclass
class _Tally:
    """What one side's slices of a throughput run add up to."""

    seconds: float = 0.0
    requests: int = 0
    daemon_cpu: float = 0.0
    main_cpu: float = 0.0
    etcd_cpu: float = 0.0
    clients_cpu: float = 0.0
    latencies: list[float] = field(default_factory=list)

    async def slice(self, clients: int, requests: list[T], send: Callable[[T], Awaitable[None]], daemon: int | None, etcd: int) -> None:
        """One closed-loop slice of `requests`, with the CPU seconds of the processes it drives."""
        before = cpu_seconds(daemon) if daemon else 0.0, cpu_seconds(etcd), time.process_time()
        main = cpu_seconds(daemon, thread=daemon) if daemon else 0.0
        seconds, latencies = await _closed_loop(clients, requests, send)
        self.seconds += seconds
        self.requests += len(requests)
        self.daemon_cpu += (cpu_seconds(daemon) if daemon else 0.0) - before[0]
        self.main_cpu += (cpu_seconds(daemon, thread=daemon) if daemon else 0.0) - main
        self.etcd_cpu += cpu_seconds(etcd) - before[1]
        self.clients_cpu += time.process_time() - before[2]
        self.latencies += latencies

    def result(self) -> Throughput:
        """The side's figures over all its slices."""
        return Throughput(
            self.requests / self.seconds, self.daemon_cpu, self.etcd_cpu, self.clients_cpu, pct(self.latencies, 0.99), self.requests,
            self.main_cpu / self.seconds,
        )


def _bare_bodies(rounds: list[list[Record]]) -> list[list[bytes]]:
    """Per slice, per ingress: one txn of its keys, its record and a beacon (what the exporter would write for it alone)."""
    layout = KeyLayout(ROOT_KEY, RECORDS)
    beacon = layout.beacon_key(layout.root("bench"))
    return [
        [txn_body([], [Op(k, v) for k, v in [*keys, (beacon, f"bare {n}.{i}")]]) for i, keys in enumerate(ingress_keys(batch))]
        for n, batch in enumerate(rounds)
    ]


def _grpc_bodies(rounds: list[list[Record]]) -> list[list[bytes]]:
    """The transactions of `_bare_bodies`, as serialized gRPC `TxnRequest`s."""
    layout = KeyLayout(ROOT_KEY, RECORDS)
    beacon = layout.beacon_key(layout.root("bench"))

    def txn(puts: list[tuple[str, str]]) -> bytes:
        ops = [rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=k.encode(), value=v.encode())) for k, v in puts]
        return rpc_pb2.TxnRequest(success=ops).SerializeToString()

    return [[txn([*keys, (beacon, f"bare {n}.{i}")]) for i, keys in enumerate(ingress_keys(batch))] for n, batch in enumerate(rounds)]


def _grpc_sender(channel: grpc.aio.Channel) -> Callable[[bytes], Awaitable[None]]:
    """Sends one serialized `TxnRequest` over `channel`."""
    txn = channel.unary_unary("/etcdserverpb.KV/Txn", request_serializer=bytes, response_deserializer=rpc_pb2.TxnResponse.FromString)

    async def send(body: bytes) -> None:
        await txn(body, timeout=30)

    return send


@dataclass
class Bare:
    """The two bare writers of one run: over the JSON gateway and over gRPC."""

    gateway: Throughput
    grpc: Throughput


async def throughput(
    in_place: int = 1000, slices: int = 6, clients: int = 50, servers: tuple[Server, ...] = (start_daemon,)
) -> tuple[list[Throughput], Bare]:
    """Each of `servers` (the exporter unless told) and the bare writer from the same `clients` clients, in interleaved slices.

    A server: single-ingress upserts of the ingresses in place, each server on an etcd of its
    own. The bare writer: each request one txn of that ingress's keys, its record and a
    beacon, straight to another etcd holding the same keys. Each slice is one new revision of
    every ingress in place, sent to each side in turn (which side goes first rotates), so
    that the machine's drift during a run (a shared machine's speed moves by tens of percent
    within seconds) hits every side alike and the ratios are same-moment ones.
    """
    rounds = _changes(in_place, slices)
    bare_bodies, grpc_bodies = _bare_bodies(rounds), _grpc_bodies(rounds)
    tallies, bare, bare_grpc = [_Tally() for _ in servers], _Tally(), _Tally()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        bare_etcd, grpc_etcd = stack.enter_context(fresh_etcd()), stack.enter_context(fresh_etcd())
        etcds = [stack.enter_context(fresh_etcd()) for _ in servers]
        started = [_started(stack, server, etcd.url, tmp / str(k)) for k, (server, etcd) in enumerate(zip(servers, etcds, strict=True))]
        for etcd in (bare_etcd, grpc_etcd):
            await raw_write(etcd.url, exporter_keys(make_records(in_place)), 8)
        async with contextlib.AsyncExitStack() as sessions:
            channel = grpc.aio.insecure_channel(grpc_etcd.url.removeprefix("http://"))
            sessions.push_async_callback(channel.close)
            send_grpc = _grpc_sender(channel)
            session = await sessions.enter_async_context(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)))
            bare_session = await sessions.enter_async_context(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)))
            for _proc, base in started:
                await wait_up(session, base)
                await put_in_place(session, base, in_place)

            async def send_bare(body: bytes) -> None:
                async with bare_session.post(f"{bare_etcd.url}/v3/kv/txn", data=body) as resp:
                    resp.raise_for_status()
                    await resp.read()

            for n, batch in enumerate(rounds):
                sides = [
                    tally.slice(clients, batch, _pusher(session, base), proc.pid, etcd.proc.pid)
                    for tally, (proc, base), etcd in zip(tallies, started, etcds, strict=True)
                ]
                sides.append(bare.slice(clients, bare_bodies[n], send_bare, None, bare_etcd.proc.pid))
                sides.append(bare_grpc.slice(clients, grpc_bodies[n], send_grpc, None, grpc_etcd.proc.pid))
                first = n % len(sides)
                for side in sides[first:] + sides[:first]:
                    await side
    return [t.result() for t in tallies], Bare(bare.result(), bare_grpc.result())


def _pusher(session: aiohttp.ClientSession, base: str) -> Callable[[Record], Awaitable[None]]:
    """Sends one upsert of one record to the push API at `base`."""

    async def send(record: Record) -> None:
        await upsert(session, base, [record])

    return send


def _started(stack: contextlib.ExitStack, server: Server, etcd_url: str, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`server` started on `etcd_url` (stopped when `stack` closes): its process and push API URL."""
    work.mkdir()
    proc, base, _control = server(etcd_url, work)

    def stop() -> None:
        proc.terminate()
        proc.wait(30)

    stack.callback(stop)
    return proc, base


def checkout(path: Path | None, log_level: str) -> Server:
    """Starts the daemon logging at `log_level`; from the checkout `path` when given (first on the child's PYTHONPATH)."""

    def start(etcd_url: str, work: Path) -> tuple[subprocess.Popen[bytes], str, str]:
        env = {"PYTHONPATH": str(path.resolve())} if path is not None else {}
        return start_daemon(etcd_url, work, EXPORTER_LOG__LEVEL=log_level, **env)

    return start


async def report_throughput(runs: int, against: Path | None, log_level: str, against_log_level: str) -> None:
    """The exporter (and the daemon of the checkout `against`, in the same slices) against both bare writers: each run, medians."""
    this = checkout(None, log_level)
    servers = (this,) if against is None else (this, checkout(against, against_log_level))
    results = [await throughput(servers=servers) for _ in range(runs)]

    def us(side: Throughput, cpu: float) -> str:
        return f"{cpu / side.requests * 1e6:.0f} us"

    for (ours, *other), bare in results:
        print(f"  run: exporter {ours.rate:.0f}/s (p99 {ours.p99 * 1000:.0f} ms; CPU per ingress daemon {us(ours, ours.daemon_cpu)}, "
              f"its main thread on a CPU {ours.main_busy:.0%} of the time, etcd {us(ours, ours.etcd_cpu)}); "
              f"bare gateway {bare.gateway.rate:.0f}/s (etcd {us(bare.gateway, bare.gateway.etcd_cpu)}, "
              f"clients {us(bare.gateway, bare.gateway.clients_cpu)}): {ours.rate / bare.gateway.rate:.2f}x; bare gRPC "
              f"{bare.grpc.rate:.0f}/s (etcd {us(bare.grpc, bare.grpc.etcd_cpu)}, clients {us(bare.grpc, bare.grpc.clients_cpu)}): "
              f"{ours.rate / bare.grpc.rate:.2f}x"
              + "".join(f"; {against}: {o.rate:.0f}/s, {o.rate / bare.gateway.rate:.2f}x the gateway writer, daemon "
                        f"{us(o, o.daemon_cpu)}, etcd {us(o, o.etcd_cpu)} per ingress" for o in other))
    gateway = [ours.rate / bare.gateway.rate for (ours, *_), bare in results]
    grpc_ratio = [ours.rate / bare.grpc.rate for (ours, *_), bare in results]
    print(f"50 concurrent clients, one ingress per request, 1,000 in place: exporter {median([r[0][0].rate for r in results]):.0f} "
          f"upserts/s, p99 {median([r[0][0].p99 for r in results]) * 1000:.0f} ms; against the bare gateway writer "
          f"({median([b.gateway.rate for _, b in results]):.0f}/s) {median(gateway):.2f}x (target >= 1.2), against the bare gRPC "
          f"writer ({median([b.grpc.rate for _, b in results]):.0f}/s) {median(grpc_ratio):.2f}x (target >= 0.85); etcd CPU per "
          f"pushed ingress {median([r[0][0].etcd_cpu / r[0][0].requests for r in results]) * 1e6:.0f} us")
    if against is not None:
        etcd_before = median([o.etcd_cpu / o.requests for (_, o), _b in results])
        etcd_now = median([ours.etcd_cpu / ours.requests for (ours, _), _b in results])
        print(f"  {against}: {median([o.rate / b.gateway.rate for (_, o), b in results]):.2f}x the gateway writer; etcd CPU per "
              f"pushed ingress {etcd_before * 1e6:.0f} us, now {etcd_now / etcd_before:.2f}x that (target <= 0.5)")


async def floor(runs: int, log_level: str) -> None:
    """The exporter (logging at `log_level`) and each floor server against both bare writers, alternated within each run; medians."""
    servers: dict[str, Server] = {"exporter": checkout(None, log_level), **{work: floor_server(work) for work in WORK}}
    measured: dict[str, list[tuple[Throughput, Bare]]] = {name: [] for name in servers}
    for _ in range(runs):
        for name, server in servers.items():
            (ours,), bare = await throughput(servers=(server,))
            measured[name].append((ours, bare))
            print(f"  run: {name} {ours.rate:.0f}/s, bare gateway {bare.gateway.rate:.0f}/s: {ours.rate / bare.gateway.rate:.2f}x, "
                  f"bare gRPC {bare.grpc.rate:.0f}/s: {ours.rate / bare.grpc.rate:.2f}x", flush=True)

    def us(sides: list[Throughput], cpu: Callable[[Throughput], float]) -> str:
        return f"{median([cpu(s) / s.requests for s in sides]) * 1e6:.0f}"

    print("50 clients, one ingress per request, 1,000 in place; ratios against the bare gateway and the bare gRPC writer; "
          "CPU per request: the server's, etcd's, the clients'")
    for name, pairs in measured.items():
        served = [o for o, _ in pairs]
        gateway, grpc_ = [o.rate / b.gateway.rate for o, b in pairs], [o.rate / b.grpc.rate for o, b in pairs]
        print(f"  {name:9s} {median([o.rate for o in served]):5.0f}/s: {median(gateway):.2f}x (runs {_runs(gateway)}), "
              f"{median(grpc_):.2f}x (runs {_runs(grpc_)}); CPU {us(served, lambda r: r.daemon_cpu)} / "
              f"{us(served, lambda r: r.etcd_cpu)} / {us(served, lambda r: r.clients_cpu)} us")
    for label, bares in (("gateway", [b.gateway for pairs in measured.values() for _, b in pairs]),
                         ("gRPC", [b.grpc for pairs in measured.values() for _, b in pairs])):
        print(f"  the bare {label} writer: {median([b.rate for b in bares]):.0f}/s; "
              f"CPU per request etcd {us(bares, lambda r: r.etcd_cpu)} us, clients {us(bares, lambda r: r.clients_cpu)} us")


@contextlib.asynccontextmanager
async def otlp_sink() -> AsyncIterator[tuple[str, list[int]]]:
    """An OTLP/gRPC receiver that answers every export without decoding it: its endpoint, and [exports, bytes] so far."""
    counts = [0, 0]

    async def export(request: bytes, _context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        counts[0] += 1
        counts[1] += len(request)
        return b""  # an empty ExportTraceServiceResponse

    port = free_port()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService", {"Export": grpc.unary_unary_rpc_method_handler(export)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield f"http://127.0.0.1:{port}", counts
    finally:
        await server.stop(1)


def traced(endpoint: str, ratio: float, log_level: str) -> Server:
    """Starts the daemon exporting its spans to `endpoint`, keeping `ratio` of new traces."""

    def start(etcd_url: str, work: Path) -> tuple[subprocess.Popen[bytes], str, str]:
        return start_daemon(etcd_url, work, EXPORTER_LOG__LEVEL=log_level, EXPORTER_OTEL__ENABLED="true",
                            EXPORTER_OTEL__ENDPOINT=endpoint, EXPORTER_OTEL__SAMPLE_RATIO=str(ratio))

    return start


async def report_tracing(runs: int, against: Path | None, log_level: str) -> None:
    """The daemon's CPU per push with tracing at 1.0 and 0.01 against disabled (and the checkout `against`), same slices."""
    async with otlp_sink() as (endpoint, counts):
        servers = {"disabled": checkout(None, log_level), "1.0": traced(endpoint, 1.0, log_level),
                   "0.01": traced(endpoint, 0.01, log_level)}
        if against is not None:
            servers[f"{against} (disabled)"] = checkout(against, log_level)
        results: list[list[Throughput]] = []
        for _ in range(runs):
            sides, _bare = await throughput(servers=tuple(servers.values()))
            results.append(sides)
            base = sides[0].daemon_cpu / sides[0].requests
            each = zip(servers, sides, strict=True)
            print("  run: " + "; ".join(f"{name} {side.rate:.0f}/s, daemon {side.daemon_cpu / side.requests * 1e6:.0f} us per push "
                                        f"({side.daemon_cpu / side.requests / base:.2f}x; main thread "
                                        f"{side.main_busy / side.rate * 1e6:.0f} us)" for name, side in each), flush=True)
        print(f"50 clients, one ingress per push, 1,000 in place; {counts[0]} exports ({counts[1] / 1e6:.1f} MB) reached the sink")
        for k, name in enumerate(servers):
            ratios = [run[k].daemon_cpu / run[k].requests / (run[0].daemon_cpu / run[0].requests) for run in results]
            print(f"  {name}: daemon CPU per push {median([r[k].daemon_cpu / r[k].requests for r in results]) * 1e6:.0f} us, "
                  f"{median(ratios):.2f}x disabled (runs {_runs(ratios)}); {median([r[k].rate for r in results]):.0f} pushes/s"
                  + (" (target <= 1.3x)" if name == "1.0" else ""))


def _runs(ratios: list[float]) -> str:
    return ", ".join(f"{r:.2f}" for r in ratios)


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds a process (or one of its threads) has used so far."""
    stat = Path(f"/proc/{pid}/task/{thread}/stat" if thread is not None else f"/proc/{pid}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
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
    parser = arguments(__doc__, runs=3)
    parser.add_argument("--ingresses", type=int, default=10_000)
    parser.add_argument("--only", choices=["latency", "throughput", "floor", "served", "tracing"], help="run one part only")
    parser.add_argument("--against", type=Path, help="throughput, tracing: also the daemon of this checkout, in the same slices")
    parser.add_argument("--log-level", default="WARNING",
                        help="throughput, floor: the daemon's log.level (default WARNING; the daemon's own default is INFO)")
    parser.add_argument("--against-log-level", help="throughput: the log.level of the --against daemon (default: --log-level)")
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

    if args.only in (None, "throughput"):
        await report_throughput(args.runs, args.against, args.log_level, args.against_log_level or args.log_level)
    if args.only == "floor":
        await floor(args.runs, args.log_level)
    if args.only == "tracing":
        await report_tracing(args.runs, args.against, args.log_level)

    for per_request, target in ((1, 3.0), (100, 1.5)) if args.only in (None, "served") else ():
        runs = [await push_to_served(per_request=per_request) for _ in range(args.runs)]
        print(f"push-to-served: 1000 new ingresses, {per_request} per request, 10 clients: all served by Traefik "
              f"{median([r.seconds for r in runs]):.2f}s after the first push (target <= {target}; runs "
              + ", ".join(f"{r.seconds:.2f}" for r in runs) + f"); {median([r.revisions for r in runs]):.0f} etcd revisions, "
              f"Traefik CPU {median([r.traefik_cpu for r in runs]):.2f}s, daemon CPU {median([r.daemon_cpu for r in runs]):.2f}s")


if __name__ == "__main__":
    asyncio.run(main())
