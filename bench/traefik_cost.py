"""What one change costs Traefik at a large root, by the keys the exporter writes: D, against D of
typical ingresses in the layout before, measured in the same run.

D, the floor of any change: with N ingresses in place (written before Traefik starts) and Traefik
idle, ONE more ingress is written by a bare client as one transaction of exactly the keys the
exporter would write for it; D is the time until Traefik lists it, and Traefik's CPU until it is
idle again is reported beside. Each run measures the baseline (typical ingresses in the layout of
the tree `--against`) and then the chosen workload and layout, so every ratio is a same-run one.

Workloads: typical (one host, two servers), `--edge` (every model-serving edge field, equal
settings on every ingress), `--edge-distinct` (the same, each ingress with an allowlist of its
own). Layouts: `--layout after` (this tree: shared edge objects, no values equal to Traefik's
defaults), `--layout before` (the keys the tree `--against` writes). `--file-provider` also gives a
Traefik the same configuration as one file and adds one router to it: the rebuild without the KV
listing and decoding. Traefik's memory is printed beside: resident once idle after the change, and
its peak (VmHWM), in MB.

Usage: .venv/bin/python -m bench.traefik_cost --against DIR [--routers 10000] [--runs 3]
           [--edge | --edge-distinct] [--layout before|after] [--file-provider]
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import RECORDS, ROOT_KEY, fresh_etcd, ingress_body, raw_write, until_idle, until_listed
from bench.harness import arguments, cpu_seconds, median, memory_mb
from exporter.embedded import start_traefik
from exporter.etcd.client import EtcdClient
from exporter.etcd.types import Op

ROOT = "traefik/worker_bench"
REPO = Path(__file__).resolve().parent.parent
# Run with a tree's package first on the path: the keys that tree writes for the ingresses on stdin,
# as {"bulk": the first N into an empty etcd, "more": the last one with the N in place}.
_KEYS = f"""
import json, sys
from exporter.ingress import Ingress
from exporter.keys import KeyLayout
from exporter.plan.planner import Planner
from exporter.render.renderer import Renderer
from exporter.render.root_keys import generate_certificate
from exporter.store.observed import Observed
from exporter.store.records import Record

records = [Record.of(Ingress.model_validate(b)) for b in json.load(sys.stdin)]
layout = KeyLayout({ROOT_KEY!r}, {RECORDS!r})
planner = Planner(Renderer(layout, ["web"]), layout, generate_certificate())
observed = Observed(layout)
bulk = planner.plan({{r.key: r for r in records[:-1]}}, observed).changes()
for change in bulk:
    observed.set(change.key, change.new, 1)
more = planner.plan({{r.key: r for r in records}}, observed, [records[-1].key], include_roots=False).changes()
json.dump({{"bulk": [(c.key, c.new) for c in bulk], "more": [(c.key, c.new) for c in more]}}, sys.stdout)
"""

Keys = dict[str, list[tuple[str, str]]]


def layout_keys(tree: Path, n: int, edge: str) -> Keys:
    """The keys `tree` writes for `n` ingresses of the workload and for one more."""
    bodies = [ingress_body(i, edge=edge) for i in range(n + 1)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _KEYS], input=json.dumps(bodies), capture_output=True, text=True, env=env, check=True,
                          cwd=tree)
    keys: Keys = json.loads(done.stdout)
    return keys


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


async def kv_run(keys: Keys, n: int) -> tuple[float, float]:
    """D through the etcd provider: (seconds until listed, Traefik CPU until idle); prints Traefik's memory then."""
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        await raw_write(etcd.url, keys["bulk"], 8)
        traefik = start_traefik(Path(tmp), etcd.url, ROOT, ["web"])
        try:
            await until_listed(traefik, f"bench_i{n - 1}@etcd")
            await until_idle(traefik)
            async with EtcdClient([etcd.url]) as client:
                before = cpu_seconds(traefik.proc.pid)
                await client.txn([], [Op(k, v) for k, v in keys["more"]])
                listed = await until_listed(traefik, f"bench_i{n}@etcd")
                await until_idle(traefik)
                cpu = cpu_seconds(traefik.proc.pid) - before
                resident, peak = memory_mb(traefik.proc.pid)
                print(f"  Traefik with {n + 1} routers, idle: {resident:.0f} MB resident, peak {peak:.0f} MB", flush=True)
                return listed, cpu
        finally:
            traefik.stop()


async def file_run(keys: Keys, n: int) -> tuple[float, float]:
    """The same change through the file provider."""
    with fresh_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dynamic.yaml"  # JSON is YAML; Traefik goes by the extension
        path.write_text(json.dumps(dynamic_config(keys["bulk"])))
        traefik = start_traefik(Path(tmp), etcd.url, "traefik/unused", ["web"],
                                extra_args=[f"--providers.file.filename={path}", "--providers.file.watch=true"])
        try:
            await until_listed(traefik, f"bench_i{n - 1}@file")
            await until_idle(traefik)
            bigger = Path(tmp) / "dynamic.next"
            bigger.write_text(json.dumps(dynamic_config(keys["bulk"] + keys["more"])))
            before = cpu_seconds(traefik.proc.pid)
            os.replace(bigger, path)
            listed = await until_listed(traefik, f"bench_i{n}@file")
            await until_idle(traefik)
            return listed, cpu_seconds(traefik.proc.pid) - before
        finally:
            traefik.stop()


def _line(label: str, runs: list[tuple[float, float]]) -> str:
    return (f"{label}: D {median([r[0] for r in runs]):.2f}s, Traefik CPU {median([r[1] for r in runs]):.2f}s (runs "
            + ", ".join(f"{d:.2f}/{c:.2f}" for d, c in runs) + ")")


async def main() -> None:
    parser = arguments(__doc__, runs=3)
    parser.add_argument("--routers", type=int, default=10_000)
    parser.add_argument("--against", type=Path, required=True, help="a checkout of the tree before: the baseline's layout")
    workload = parser.add_mutually_exclusive_group()
    workload.add_argument("--edge", action="store_const", const="equal", dest="workload", default="")
    workload.add_argument("--edge-distinct", action="store_const", const="distinct", dest="workload")
    parser.add_argument("--layout", choices=("before", "after"), default="after")
    parser.add_argument("--file-provider", action="store_true")
    args = parser.parse_args()
    n = args.routers
    baseline = layout_keys(args.against, n, "")
    case = layout_keys(args.against if args.layout == "before" else REPO, n, args.workload)
    label = f"{args.workload or 'typical'} ingresses, layout {args.layout}"
    print(f"{n} in place; keys per ingress: baseline {len(baseline['more'])}, {label} {len(case['more'])}; "
          f"keys in place: {len(baseline['bulk'])} and {len(case['bulk'])}")
    base_runs: list[tuple[float, float]] = []
    case_runs: list[tuple[float, float]] = []
    for _ in range(args.runs):  # alternated: the machine's drift hits both alike
        base_runs.append(await kv_run(baseline, n))
        case_runs.append(await kv_run(case, n))
    print(_line("baseline (typical, layout before)", base_runs))
    print(_line(label, case_runs))
    ratios = [c[0] / b[0] for b, c in zip(base_runs, case_runs, strict=True)]
    print(f"{label}: D = {median(ratios):.2f}x the baseline's (runs " + ", ".join(f"{r:.2f}" for r in ratios) + ")")
    if args.file_provider:
        print(_line(f"file provider, {label}", [await file_run(case, n) for _ in range(args.runs)]))


if __name__ == "__main__":
    asyncio.run(main())
