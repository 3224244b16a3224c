"""A loopback TCP link in front of an etcd port (a client port or a peer port) that the campaign
can cut, drop, slow down or isolate one sender on, each way or one way.

Cut, it behaves as a partition does, not as a refused connection: bytes in the cut direction are
held without an answer, so the other end sees its requests time out. Dropped, every connection is
reset and new ones are reset as they arrive. Delayed, every chunk waits before it is forwarded,
in order, so transactions get slow rather than fail. Healed, whatever was held is closed (as the
other end's timeouts would have abandoned it) and bytes flow again. Without root or network
namespaces this is how one sidecar is cut off from one member, or a member from its peers, while
the rest of the cluster keeps talking.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import re
import socket
import struct
import time

from tests.etcd_cluster import stable_port

UP, DOWN = "up", "down"  # toward the port the link fronts, and back
BOTH = frozenset({UP, DOWN})
BIND_ATTEMPTS = 5
SENDER = re.compile(rb"X-Server-From: ([0-9a-f]+)", re.IGNORECASE)  # a raft peer names itself on every request


class Link:
    """Accepts on `port` and forwards each connection to `target_port`, impaired as told."""

    def __init__(self, port: int, target_port: int) -> None:
        self.port, self.target_port = port, target_port
        self.mode = "open"  # open, cut, drop, delay
        self.directions: frozenset[str] = BOTH
        self.seconds = 0.0
        self.isolated: set[str] = set()  # raft member ids (hex) whose connections are held
        self._healed = asyncio.Event()
        self._healed.set()
        self._open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cut(self) -> bool:
        """Impaired in a way that stops bytes: cut (either way) or dropped."""
        return self.mode in ("cut", "drop")

    async def start(self) -> None:
        """Listen on `port`, or on another stable port if it was taken since it was found free.

        Nothing names a link's port before it listens (members and sidecars are configured after),
        and it keeps that port for the whole run, so moving it here costs nothing.
        """
        for _ in range(BIND_ATTEMPTS - 1):
            try:
                self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
                return
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                self.port = stable_port()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._drop()

    def partition(self, directions: frozenset[str] = BOTH) -> None:
        """Hold everything sent in `directions` from now on."""
        self._impair("cut", directions)

    def drop(self) -> None:
        """Reset every connection, and each new one, until healed."""
        self._impair("drop", BOTH)
        self._drop(reset=True)

    def reset(self) -> None:
        """Reset every connection open now (as a restarted proxy or a flushed NAT table does); new ones pass."""
        self._drop(reset=True)

    def delay(self, seconds: float, directions: frozenset[str] = BOTH) -> None:
        """Forward every chunk sent in `directions` `seconds` late."""
        self._impair("delay", directions)
        self.seconds = seconds

    def isolate(self, member_id: str) -> None:
        """Hold the connections a raft peer opens through this link, named by its X-Server-From."""
        self.isolated.add(member_id)
        self._healed.clear()

    def heal(self) -> None:
        """Close what was held; forward again, at full speed."""
        was_held = self.mode == "cut" or bool(self.isolated)
        self.mode, self.directions, self.seconds = "open", BOTH, 0.0
        self.isolated.clear()
        if was_held:
            self._drop()
        self._healed.set()

    def _impair(self, mode: str, directions: frozenset[str]) -> None:
        self.mode, self.directions = mode, directions
        if mode != "delay":
            self._healed.clear()

    def _holds(self, direction: str, sender: str | None) -> bool:
        return (self.mode == "cut" and direction in self.directions) or (sender is not None and sender in self.isolated)

    def _drop(self, reset: bool = False) -> None:
        for writer in list(self._open):
            if reset:
                _reset(writer)
            writer.close()
        self._open.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "drop":
            _reset(writer)
            writer.close()
            return
        self._open.add(writer)
        try:
            if self.mode == "cut" and self.directions == BOTH:
                await self._healed.wait()  # no connection gets through a partition
                if writer.is_closing():  # accepted while cut: dropped at the heal
                    return
            upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            self._open.discard(writer)
            writer.close()
            return
        self._open.add(upstream)
        sender: list[str] = []  # learnt from the first request that names it
        await asyncio.gather(self._pipe(reader, upstream, UP, sender), self._pipe(upstream_reader, writer, DOWN, sender))
        for end in (writer, upstream):
            self._open.discard(end)
            end.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str, sender: list[str]) -> None:
        late: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        forward = asyncio.create_task(self._forward(late, writer))
        with contextlib.suppress(OSError, ConnectionError):
            while data := await reader.read(65536):
                if not sender and (named := SENDER.search(data)):
                    sender.append(named.group(1).decode().lstrip("0"))
                if self._holds(direction, sender[0] if sender else None):
                    await self._healed.wait()
                    break
                delay = self.seconds if self.mode == "delay" and direction in self.directions else 0.0
                late.put_nowait((time.monotonic() + delay, data))
        late.put_nowait((0.0, b""))
        await forward

    async def _forward(self, late: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
        """Writes each chunk at its time, in order; an empty chunk ends the direction."""
        with contextlib.suppress(OSError, ConnectionError, RuntimeError):
            while (item := await late.get())[1]:
                if (wait := item[0] - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                writer.write(item[1])
                await writer.drain()
            writer.write_eof()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST rather than a FIN: the peer sees 'connection reset'."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
