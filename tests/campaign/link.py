"""A loopback TCP link between one sidecar and one etcd member that the campaign can cut.

Cut, it behaves as a partition does, not as a refused connection: bytes already in flight and
new connections are held without an answer, so the sidecar sees its requests time out. Healed,
the held connections are closed (as the sidecar's timeouts would have abandoned them) and new
ones flow again. Without root or network namespaces this is how one sidecar is cut off from
etcd while the rest of the cluster keeps talking.
"""

from __future__ import annotations

import asyncio
import contextlib


class Link:
    """Accepts on `port` and forwards each connection to `target_port` while not cut."""

    def __init__(self, port: int, target_port: int) -> None:
        self.port, self.target_port = port, target_port
        self.cut = False
        self._healed = asyncio.Event()
        self._healed.set()
        self._open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._drop()

    def partition(self) -> None:
        """Hold everything from now on."""
        self.cut = True
        self._healed.clear()

    def heal(self) -> None:
        """Close what was held; forward again."""
        self.cut = False
        self._drop()
        self._healed.set()

    def _drop(self) -> None:
        for writer in list(self._open):
            writer.close()
        self._open.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            await self._healed.wait()
            if writer.is_closing():  # accepted while cut: dropped at the heal
                return
            upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            self._open.discard(writer)
            writer.close()
            return
        self._open.add(upstream)
        await asyncio.gather(self._pipe(reader, upstream), self._pipe(upstream_reader, writer))
        for end in (writer, upstream):
            self._open.discard(end)
            end.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await reader.read(65536):
                if self.cut:
                    await self._healed.wait()
                    return
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError, ConnectionError, RuntimeError):
            writer.write_eof()
