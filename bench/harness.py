"""The benchmarks' harness: arguments, repeated runs, medians and percentiles, the daemon as a child.

Every benchmark runs as `python -m bench.NAME`, takes `--runs` (where it repeats a measurement)
and prints one line per figure, each against a baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from exporter.embedded import free_port

TOKEN = "bench-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def arguments(doc: str | None, runs: int | None = 3) -> argparse.ArgumentParser:
    """The parser of a benchmark described by `doc` (its module docstring), with `--runs` when it repeats."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if runs is not None:
        parser.add_argument("--runs", type=int, default=runs, help=f"measurements whose median is printed (default {runs})")
    return parser


def median(values: list[float]) -> float:
    """The median: the machine is shared and noisy, one run proves little."""
    return statistics.median(values)


def pct(values: list[float], q: float) -> float:
    """The `q` quantile (0.99: p99) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mb(pid: int) -> tuple[float, float]:
    """A process's (resident, peak resident) MB."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


def start_daemon(etcd_url: str, work: Path, **env: str) -> tuple[subprocess.Popen[bytes], str, str]:
    """The daemon as a child on `etcd_url` (settings from `EXPORTER_*` in `env`); returns it, the API and control URLs."""
    api, control = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    full = {**os.environ, "EXPORTER_API__TOKEN": TOKEN, "EXPORTER_API__LISTEN": api,
            "EXPORTER_CONTROL__LISTEN": control, "EXPORTER_ETCD__ENDPOINTS": f'["{etcd_url}"]',
            "EXPORTER_LOG__LEVEL": "WARNING", **env}
    with open(work / "daemon.log", "ab") as log:  # the child keeps its own copy open
        proc = subprocess.Popen([sys.executable, "-m", "exporter", "run"], env=full, cwd=work,
                                stdout=subprocess.DEVNULL, stderr=log)
    return proc, f"http://{api}", f"http://{control}"


async def wait_up(session: aiohttp.ClientSession, base: str) -> None:
    """Until the daemon's push API answers."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            async with session.get(f"{base}/v2/ingress?authority=none", headers=HEADERS) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError("daemon did not come up")
