"""Active probes: HTTP (method, path, headers, expected status, timeout) and TCP connect.

Like lua-resty-healthcheck, an HTTP probe opens a new connection, sends one request with
`Connection: close` and reads only the status line: a probe really reaches the server
(never a pooled keep-alive connection that outlived it), and costs a fraction of a full
HTTP client, so one daemon can probe thousands of targets per second.

A node at an IP literal over plain HTTP or TCP is probed on a non-blocking socket driven by the loop's
readiness callbacks: no transport, stream or task per probe, which halves a probe's CPU
(docs/performance.md, "Probing spread over three sidecars"). TLS and host names (resolved
first) go through asyncio's streams.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import socket
import ssl

from .checkers import CheckConfig, Node
from .state import Outcome

# Upstream certificates are not verified by probes: a probe checks liveness, not identity.
_TLS = ssl.create_default_context()
_TLS.check_hostname = False
_TLS.verify_mode = ssl.CERT_NONE

AGENT = "traefik-etcd-exporter-healthcheck"
# A status line longer than this is not one.
_STATUS_LINE_LIMIT = 1024


def _request(node: Node, check: CheckConfig, agent: str) -> bytes:
    lines = [
        f"{check.method} {check.path} HTTP/1.1",
        f"Host: {node.ip}:{node.port}",
        f"User-Agent: {agent}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in check.headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _outcome(status_line: bytes, expected: int) -> Outcome:
    parts = status_line.rstrip(b"\r\n").split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return "http_failure"
    return "success" if int(parts[1]) == expected else "http_failure"


@functools.lru_cache(maxsize=65536)
def _literal(host: str) -> socket.AddressFamily | None:
    """The address family of an IP literal, None for a host name."""
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return None


class _Exchange:
    """One probe on a non-blocking socket: connect, then (HTTP) send the request and read the status line.

    Its `result` is the outcome; cancelling it (the probing task stopped) closes the socket as finishing does.
    """

    __slots__ = ("_connecting", "_expected", "_fd", "_got", "_loop", "_open", "_request", "_sock", "_timer", "result")

    def __init__(self, loop: asyncio.AbstractEventLoop, family: socket.AddressFamily, request: bytes | None, expected: int) -> None:
        self._loop = loop
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setblocking(False)
        self._fd = self._sock.fileno()
        self._request, self._expected, self._got = memoryview(request or b""), expected, b""
        self._connecting, self._open = True, True
        self._timer: asyncio.TimerHandle | None = None
        self.result: asyncio.Future[Outcome] = loop.create_future()
        self.result.add_done_callback(self._close)

    def start(self, address: tuple[str, int], timeout: float) -> asyncio.Future[Outcome]:
        """Connect to `address`; the outcome comes within `timeout` seconds."""
        self._timer = self._loop.call_later(timeout, self._finish, "timeout_failure")
        if self._sock.connect_ex(address) not in (0, errno.EINPROGRESS):
            self._finish("tcp_failure")
        elif self._request:
            # A connection on loopback or a near host is often up already: then the request goes at once.
            self._send()
        else:
            self._loop.add_writer(self._fd, self._writable)
        return self.result

    def _writable(self) -> None:
        if self._connecting:
            if self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                return self._finish("tcp_failure")
            self._connecting = False
            if not self._request:  # a TCP probe: connected is all it asks
                return self._finish("success")
        return self._send()

    def _send(self) -> None:
        try:
            self._request = self._request[self._sock.send(self._request):]
        except BlockingIOError:  # not connected yet, or the buffer is full: go on once writable
            self._loop.add_writer(self._fd, self._writable)
            return None
        except OSError:
            return self._finish("tcp_failure")
        self._connecting = False
        if self._request:
            self._loop.add_writer(self._fd, self._writable)
        else:
            self._loop.remove_writer(self._fd)
            self._loop.add_reader(self._fd, self._readable)
        return None

    def _readable(self) -> None:
        try:
            data = self._sock.recv(256)
        except BlockingIOError:
            return None
        except OSError:
            return self._finish("tcp_failure")
        self._got += data
        if not data or b"\n" in self._got or len(self._got) > _STATUS_LINE_LIMIT:
            return self._finish(_outcome(self._got.split(b"\n", 1)[0], self._expected))
        return None

    def _finish(self, outcome: Outcome) -> None:
        self._close(None)
        if not self.result.done():
            self.result.set_result(outcome)

    def _close(self, _: object) -> None:
        if not self._open:
            return
        self._open = False
        if self._timer is not None:
            self._timer.cancel()
        self._loop.remove_writer(self._fd)
        self._loop.remove_reader(self._fd)
        self._sock.close()


async def _exchange(node: Node, family: socket.AddressFamily, request: bytes | None, check: CheckConfig) -> Outcome:
    try:
        exchange = _Exchange(asyncio.get_running_loop(), family, request, check.expected_status)
    except OSError:  # no socket to be had (the process is out of descriptors)
        return "tcp_failure"
    return await exchange.start((node.ip, node.port), check.timeout)


async def http_probe(node: Node, check: CheckConfig, agent: str = AGENT) -> Outcome:
    """Send the check request; success when the status is the expected one.

    `agent` is the User-Agent: the daemon's names the sidecar probing, so a server's log shows who probes it.
    """
    request = _request(node, check, agent)
    tls = node.url.startswith("https://")
    if not tls and (family := _literal(node.ip)) is not None:
        return await _exchange(node, family, request, check)
    writer = None
    try:
        async with asyncio.timeout(check.timeout):
            reader, writer = await asyncio.open_connection(
                node.ip, node.port, ssl=_TLS if tls else None, server_hostname=node.ip if tls else None)
            writer.write(request)
            status_line = await reader.readline()
    except TimeoutError:
        return "timeout_failure"
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
        return "tcp_failure"
    finally:
        if writer is not None:
            writer.close()
    return _outcome(status_line, check.expected_status)


async def tcp_probe(node: Node, check: CheckConfig) -> Outcome:
    """Open (and close) a TCP connection to the node."""
    if (family := _literal(node.ip)) is not None:
        return await _exchange(node, family, None, check)
    try:
        async with asyncio.timeout(check.timeout):
            _reader, writer = await asyncio.open_connection(node.ip, node.port)
    except TimeoutError:
        return "timeout_failure"
    except OSError:
        return "tcp_failure"
    writer.close()
    return "success"
