"""One sharded sidecar of bench.probe_capacity (a process it starts, not a benchmark).

Argv: ETCD_URL SPACE TARGETS SIDECARS SECONDS PORT...: it announces itself on a real lease with
`health.sharding: on`, probes its share of TARGETS once SIDECARS are live, prints `ready`, waits
for a line on stdin, measures for SECONDS and prints {"p99", "rate", "share", "cpu"} (CPU seconds per probe) as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from loguru import logger

from bench.harness import pct
from bench.probe_capacity import add_targets, lagged
from exporter.assembly import factories
from exporter.config import Settings
from exporter.health.checkers import load_kinds
from exporter.health.engine import HealthEngine
from exporter.health.kinds import BUILTIN
from exporter.health.sharding import Shards
from exporter.leader import Leadership
from exporter.reconcile import Inbox


async def main(etcd_url: str, space: str, targets: int, sidecars: int, seconds: float, ports: list[int]) -> None:
    logger.remove()
    settings = Settings.model_validate({"etcd": {"endpoints": [etcd_url]}, "records_prefix": f"{space}/records",
                                        "health": {"sharding": "on"}})
    layout, etcd = settings.layout(), factories.etcd_client(settings)
    lag, metrics = lagged()
    leadership = Leadership(etcd, layout.election_key, 10)
    engine = HealthEngine(load_kinds(BUILTIN), Inbox(), concurrency=512, metrics=metrics, identity=leadership.identity)
    shards = Shards(etcd, layout, leadership.identity, metrics)
    engine.shard_with(shards)
    leadership.add_lease_listener(shards.lease_changed)
    add_targets(engine, ports, targets)
    tasks = [asyncio.create_task(leadership.run()), asyncio.create_task(shards.run())]
    engine.start_probing()
    while len(shards.members.live) < sidecars or shards.identity not in shards.members.live:
        await asyncio.sleep(0.1)
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    lag.values.clear()
    # Its share while every sidecar is live (they stop one by one after the measurement).
    share = shards.members.shares((t, u) for _, t, u in engine.nodes()).get(shards.identity, 0)

    def probes() -> float:
        return metrics.value("exporter_health_probes_total", {"result": "success"})

    start_count, started, cpu = probes(), time.perf_counter(), time.process_time()
    await asyncio.sleep(seconds)
    done = probes() - start_count
    rate, cpu_per_probe = done / (time.perf_counter() - started), (time.process_time() - cpu) / max(done, 1)
    print(json.dumps({"p99": pct(lag.values, 0.99), "rate": rate, "share": share, "cpu": cpu_per_probe}), flush=True)
    await engine.stop()
    await leadership.resign()
    for task in tasks:
        task.cancel()


if __name__ == "__main__":
    url, space, n, k, secs, *port_args = sys.argv[1:]
    asyncio.run(main(url, space, int(n), int(k), float(secs), [int(p) for p in port_args]))
