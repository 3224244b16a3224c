"""Which transport a watch should use: etcd's JSON gateway or its gRPC API, end to end (etcd plus client).

Every key the exporter writes comes back on its watches, so a watch carries as many events as
the writes. This writes the keys of N ingresses (the exporter's layout, in 128-operation
transactions) to a fresh etcd, then replays that history through a watch from revision 1 on
each transport in turn (the order alternates between runs), the client handling each event as
the daemon does with its own writes (its revision read, nothing decoded), and prints the CPU
seconds etcd and the client spent per event, and their sum, with the ratio gRPC / gateway.

Usage: .venv/bin/python -m bench.watch_transport [--ingresses 10000] [--runs 3]
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from bench.common import RECORDS, exporter_keys, fresh_etcd, make_records, raw_write
from bench.harness import arguments, cpu_seconds, median
from exporter.etcd.channel import Channels
from exporter.etcd.client import EtcdClient, Transport
from exporter.etcd.gateway import EtcdSecurity
from exporter.etcd.grpc_kv import GrpcKv
from exporter.etcd.reach import Evidence


@dataclass
class Replay:
    """One replay of the history through one transport."""

    transport: Transport
    events: int
    seconds: float
    etcd_cpu: float
    client_cpu: float

    def per_event(self, cpu: float) -> float:
        """Microseconds of `cpu` per event."""
        return cpu / self.events * 1e6


async def replay(url: str, pid: int, transport: Transport, last: int) -> Replay:
    """Watch the whole history from revision 1 until the event of revision `last` is seen."""
    events = 0
    async with EtcdClient([url], transport="gateway") as client:
        channels = Channels([url], 60.0, EtcdSecurity(), Evidence())
        # The client's watch is the gateway's; the gRPC one is GrpcKv's, measured here before it is used.
        watch = GrpcKv(channels, 5000).watch_prefix if transport == "grpc" else client.watch_prefix
        before = cpu_seconds(pid), time.process_time(), time.perf_counter()
        async for batch in watch("", 1, 60):
            events += len(batch)
            if batch[-1].mod_revision >= last:
                break
        spent = Replay(transport, events, time.perf_counter() - before[2], cpu_seconds(pid) - before[0],
                       time.process_time() - before[1])
        await channels.close()
        return spent


async def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--ingresses", type=int, default=10_000)
    args = parser.parse_args()
    keys = exporter_keys(make_records(args.ingresses))
    with fresh_etcd() as etcd:
        await raw_write(etcd.url, keys, 8)
        async with EtcdClient([etcd.url]) as client:
            last = await client.revision()
        print(f"{len(keys)} keys of {args.ingresses} ingresses (and their records under {RECORDS}), revisions 2..{last}")
        runs: list[tuple[Replay, Replay]] = []
        for n in range(args.runs):
            order: tuple[Transport, Transport] = ("gateway", "grpc") if n % 2 == 0 else ("grpc", "gateway")
            done = {t: await replay(etcd.url, etcd.proc.pid, t, last) for t in order}
            runs.append((done["gateway"], done["grpc"]))
            for r in (done["gateway"], done["grpc"]):
                print(f"  run {n + 1} {r.transport:7s}: {r.events} events in {r.seconds:.2f}s; CPU per event etcd "
                      f"{r.per_event(r.etcd_cpu):.1f} us, client {r.per_event(r.client_cpu):.1f} us", flush=True)

    def total(r: Replay) -> float:
        return r.per_event(r.etcd_cpu + r.client_cpu)

    for name, cpu in (("etcd", lambda r: r.per_event(r.etcd_cpu)), ("client", lambda r: r.per_event(r.client_cpu)), ("both", total)):
        gateway, grpc = median([cpu(g) for g, _ in runs]), median([cpu(r) for _, r in runs])
        print(f"{name:6s} CPU per event: gateway {gateway:.1f} us, gRPC {grpc:.1f} us: {grpc / gateway:.2f}x")
    print(f"gRPC / gateway, etcd plus client, median of the runs' ratios: {median([total(r) / total(g) for g, r in runs]):.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
