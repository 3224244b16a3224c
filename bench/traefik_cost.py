"""Where Traefik's cost of one change at a large root goes: its etcd provider against its file provider.

D, the floor of any change: with N routers in place and Traefik idle, ONE more ingress is written
(a bare client, one transaction of its keys), and the time until Traefik lists it and the CPU
seconds Traefik spends until it is idle again are measured. The same N routers are then given
to a Traefik through its file provider (the same dynamic configuration, as one file), and one
more router is added by rewriting the file: the same rebuild without the KV listing and decoding.
The difference is what the KV provider itself costs. Medians of `--runs`.

Usage: .venv/bin/python -m bench.traefik_cost [--routers 10000] [--runs 3]
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from bench.common import exporter_keys, fresh_etcd, ingress_keys, make_records, raw_write, until_idle, until_listed
from bench.harness import arguments, cpu_seconds, median
from exporter.embedded import start_traefik
from exporter.etcd.client import EtcdClient
from exporter.etcd.types import Op

ROOT = "traefik/worker_bench"


def dynamic_config(kvs: list[tuple[str, str]]) -> dict[str, Any]:
    """The keys under ROOT as Traefik's nested dynamic configuration (lists for indices, typed values)."""
    tree: dict[str, Any] = {}
    for key, value in kvs:
        if not key.startswith(ROOT + "/") or key.startswith(f"{ROOT}/_meta"):
            continue
        node = tree
        parts = key[len(ROOT) + 1 :].split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        typed: Any = int(value) if value.lstrip("-").isdigit() else {"true": True, "false": False}.get(value, value)
        node[parts[-1]] = typed
    config: dict[str, Any] = _lists(tree)
    return config


def _lists(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    if node and all(k.isdigit() for k in node):
        return [_lists(node[k]) for k in sorted(node)]
    return {k: _lists(v) for k, v in node.items()}


async def kv_run(n: int) -> tuple[float, float]:
    records = make_records(n + 1)
    one_more = ingress_keys(records[n:])[0]
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        await raw_write(etcd.url, exporter_keys(records[:n]), 8)
        traefik = start_traefik(Path(tmp), etcd.url, ROOT, ["web"])
        try:
            await until_listed(traefik, f"bench_i{n - 1}@etcd")
            await until_idle(traefik)
            async with EtcdClient([etcd.url]) as client:
                before = cpu_seconds(traefik.proc.pid)
                await client.txn([], [Op(k, v) for k, v in one_more])
                listed = await until_listed(traefik, f"bench_i{n}@etcd")
                await until_idle(traefik)
                return listed, cpu_seconds(traefik.proc.pid) - before
        finally:
            traefik.stop()


async def file_run(n: int) -> tuple[float, float]:
    records = make_records(n + 1)
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dynamic.yaml"  # JSON is YAML; Traefik goes by the extension
        path.write_text(json.dumps(dynamic_config(exporter_keys(records[:n]))))
        traefik = start_traefik(Path(tmp), etcd.url, "traefik/unused", ["web"],
                                extra_args=[f"--providers.file.filename={path}", "--providers.file.watch=true"])
        try:
            await until_listed(traefik, f"bench_i{n - 1}@file")
            await until_idle(traefik)
            bigger = Path(tmp) / "dynamic.next"
            bigger.write_text(json.dumps(dynamic_config(exporter_keys(records))))
            before = cpu_seconds(traefik.proc.pid)
            os.replace(bigger, path)
            listed = await until_listed(traefik, f"bench_i{n}@file")
            await until_idle(traefik)
            return listed, cpu_seconds(traefik.proc.pid) - before
        finally:
            traefik.stop()


async def main() -> None:
    parser = arguments(__doc__, runs=3)
    parser.add_argument("--routers", type=int, default=10_000)
    args = parser.parse_args()
    for label, measure in (("etcd provider", kv_run), ("file provider", file_run)):
        runs = [await measure(args.routers) for _ in range(args.runs)]
        print(f"{label}, {args.routers} routers in place, one more: listed after {median([r[0] for r in runs]):.2f}s, "
              f"Traefik CPU until idle {median([r[1] for r in runs]):.2f}s (runs " + ", ".join(f"{a:.2f}/{c:.2f}" for a, c in runs) + ")")


if __name__ == "__main__":
    asyncio.run(main())
