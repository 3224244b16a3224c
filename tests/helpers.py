"""Test helpers: polling with a deadline, ingress builders, real HTTP backends, "does Traefik serve it"
predicates, the daemon launcher, and an etcd wrapper that runs a hook before a transaction."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import aiohttp
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from exporter.embedded import free_port
from exporter.etcd.store import EtcdStore
from exporter.etcd.types import Compare, KeyValue, Op, RangePage, TxnResult, WatchEvent
from exporter.ingress import Ingress
from exporter.store.records import Record

# The repository's root: docs/, exporter/ and tests/ are under it.
REPO = Path(__file__).resolve().parent.parent

T = TypeVar("T")
AUTHORITY = "test"


async def holds(value: bool) -> bool:
    """`value` as an awaitable: `eventually(lambda: holds(cond()))` polls a plain condition."""
    return value


async def eventually(check: Callable[[], Awaitable[T | None]], timeout: float = 15.0, interval: float = 0.05) -> T:
    """Poll `check` until it returns a truthy value without raising; fail with its last error."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            result = await check()
            if result:
                return result
            last = AssertionError(f"check returned {result!r}")
        except (TimeoutError, AssertionError, OSError, KeyError, ValueError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout}s: {last!r}")
        await asyncio.sleep(interval)


def uid(prefix: str = "t") -> str:
    """A unique DNS label for test isolation."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def ingress(ingress_id: str, **fields: Any) -> Ingress:
    """An ingress of the test authority; host defaults to `<id>.test`."""
    data: dict[str, Any] = {"authority": AUTHORITY, "id": ingress_id, "revision": 1, "hosts": [f"{ingress_id}.test"]}
    data.update(fields)
    return Ingress.model_validate(data)


def ingress_yaml(iid: str, revision: int, port: int, authority: str = AUTHORITY) -> str:
    """An ingress file with one ingress of `iid` routed to 127.0.0.1:`port`."""
    return (
        "ingresses:\n"
        f"  - authority: {authority}\n    id: {iid}\n    revision: {revision}\n    hosts: [{iid}.test]\n"
        f'    upstream: {{servers: [{{url: "http://127.0.0.1:{port}"}}]}}\n'
    )


def record(ingress_id: str, **fields: Any) -> Record:
    """A record of `ingress(...)`."""
    return Record.of(ingress(ingress_id, **fields))


@dataclass
class Backend:
    """A real HTTP server on 127.0.0.1 answering its name; counts hits; can die and come back."""

    name: str
    port: int = field(default_factory=free_port)
    status: int = 200
    health: int = 200  # what /health answers
    hits: Counter[str] = field(default_factory=Counter)
    # Who probed /health and when (monotonic): the User-Agent names the sidecar.
    probes: list[tuple[float, str]] = field(default_factory=list)
    hang: bool = False  # /health accepts and never answers (a probe times out)
    ssl_context: ssl.SSLContext | None = None
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    async def start(self) -> Backend:
        async def handle(request: web.Request) -> web.Response:
            self.hits[request.path] += 1
            if request.path == "/health":
                self.probes.append((time.monotonic(), request.headers.get("User-Agent", "")))
                if self.hang:
                    await asyncio.Event().wait()  # until the server stops
            status = self.health if request.path == "/health" else self.status
            return web.Response(text=self.name, status=status)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.ssl_context).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def serve_all_paths(port: int, handle: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.AppRunner:
    """A started HTTP server on 127.0.0.1:`port` answering every method and path with `handle`."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def get_via(session: aiohttp.ClientSession, base_url: str, host: str, path: str = "/", **kwargs: Any) -> tuple[int, str]:
    """One request through Traefik with the given Host header (`headers` replaces it, with more)."""
    headers = kwargs.pop("headers", None) or {"Host": host}
    async with session.get(base_url + path, headers=headers, **kwargs) as resp:
        return resp.status, await resp.text()


async def traefik_object(session: aiohttp.ClientSession, api_url: str, kind: str, name: str) -> dict[str, Any] | None:
    """A router or service from Traefik's API (`kind` like `http/routers`), or None if absent."""
    async with session.get(f"{api_url}/api/{kind}/{name}@etcd") as resp:
        if resp.status == 404:
            return None
        resp.raise_for_status()
        data: dict[str, Any] = await resp.json()
        return data


async def router_enabled(session: aiohttp.ClientSession, api_url: str, name: str, kind: str = "http/routers") -> bool:
    """True when Traefik lists the router enabled with no error."""
    router = await traefik_object(session, api_url, kind, name)
    assert router is not None, f"router {name} not in Traefik"
    assert router.get("status") == "enabled" and not router.get("error"), router
    return True


async def serves(
    session: aiohttp.ClientSession, web_url: str, host: str, *, path: str = "/", status: int = 200, body: str | None = None
) -> bool:
    """True when Traefik answers `host` + `path` with `status` (and with `body`, when given)."""
    got, text = await get_via(session, web_url, host, path)
    return got == status and (body is None or text == body)


async def is_ready(session: aiohttp.ClientSession, control_url: str) -> bool:
    """True when a daemon's `/readyz` answers 200 (`control_url` like `http://127.0.0.1:8571`)."""
    async with session.get(f"{control_url}/readyz") as resp:
        return resp.status == 200


def start_daemon(
    config: Path, log: Path | None = None, *args: str, env: Mapping[str, str] | None = None, capture: bool = False
) -> subprocess.Popen[bytes]:
    """`traefik-etcd-exporter run --config CONFIG ARGS` as a child, its output appended to `log` (or piped when `capture`)."""
    out: IO[bytes] | int = subprocess.PIPE if capture else log.open("ab") if log is not None else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-m", "exporter", "run", "--config", str(config), *args],
        env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
    )


def stop_daemon(proc: subprocess.Popen[bytes], timeout: float = 20) -> str:
    """SIGTERM (after SIGCONT, should it be paused) and wait; SIGKILL past `timeout`. Returns captured output."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return (out or b"").decode(errors="replace")


def run_cli(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`traefik-etcd-exporter ARGS` to completion, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})},
    )


class HookedEtcd:
    """An EtcdStore that runs `before_txn` (once) before the next transaction: a peer's write in between."""

    def __init__(self, inner: EtcdStore) -> None:
        self.inner = inner
        self.before_txn: Callable[[], Awaitable[None]] | None = None

    async def get(self, key: str) -> KeyValue | None:
        return await self.inner.get(key)

    async def get_at(self, key: str, revision: int = 0) -> tuple[KeyValue | None, int]:
        return await self.inner.get_at(key, revision)

    async def range_prefix(self, prefix: str, *, revision: int = 0) -> RangePage:
        return await self.inner.range_prefix(prefix, revision=revision)

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        hook, self.before_txn = self.before_txn, None
        if hook is not None:
            await hook()
        return await self.inner.txn(compares, ops)

    def watch_prefix(
        self, prefix: str, start_revision: int, idle_timeout: float, *, end: str | None = None
    ) -> AsyncIterator[list[WatchEvent]]:
        return self.inner.watch_prefix(prefix, start_revision, idle_timeout, end=end)

    async def lease_grant(self, ttl: int) -> int:
        return await self.inner.lease_grant(ttl)

    async def lease_keepalive(self, lease: int) -> int:
        return await self.inner.lease_keepalive(lease)

    async def lease_revoke(self, lease: int) -> None:
        await self.inner.lease_revoke(lease)


def tls_backend_context(tmp_path: Path, server_name: str) -> tuple[str, ssl.SSLContext]:
    """A test CA and a server certificate for `server_name` signed by it."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "exporter test CA")])
    now = datetime.datetime.now(datetime.UTC)
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, server_name)]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(server_name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "server.pem", tmp_path / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)
    return ca.public_bytes(serialization.Encoding.PEM).decode(), context


class BannerServer:
    """A TCP backend that greets every connection with a banner and counts the connections it accepted."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.banner = f"backend-{uid()}\n".encode()
        self.accepted = 0
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._greet, "127.0.0.1", 0, ssl=self._ssl)
        return int(self._server.sockets[0].getsockname()[1])

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        writer.write(self.banner)
        await writer.drain()
        await reader.read(1)  # until the client closes
        writer.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


async def footprint(client: EtcdStore, records_prefix: str, root: str, *ids: str) -> dict[str, int]:
    """What a daemon writing `records_prefix` could have written: each of its records and each key
    under `root` named for one of `ids`, with its mod_revision.

    Tests compare this, not etcd's revision, to show that a refused request wrote nothing: the
    session etcd has other writers (the shared reconciler, leases of stopped daemons expiring).
    Every accepted ingress commits its record (docs/writer.md), so an unchanged records prefix
    means nothing was accepted.
    """
    records = await client.range_prefix(f"{records_prefix}/")
    keys = await client.range_prefix(f"{root}/")
    named = [kv for kv in keys.kvs if any(f"_{i}" in kv.key for i in ids)]
    return {kv.key: kv.mod_revision for kv in [*records.kvs, *named]}
