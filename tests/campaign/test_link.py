"""The campaign's link on a real loopback echo server: each mode does what the faults count on."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest

from tests import etcd_cluster
from tests.campaign.link import UP, Link
from tests.etcd_cluster import stable_port


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@pytest.fixture
async def link() -> AsyncIterator[Link]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    one = Link(stable_port(), server.sockets[0].getsockname()[1])
    await one.start()
    yield one
    await one.close()
    server.close()


async def _round_trip(link: Link, payload: bytes = b"ping\n", within: float = 2.0) -> bytes:
    """What comes back through the link, or b"" when nothing did within `within` seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), within)
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
        return b""
    finally:
        writer.close()


async def test_an_open_link_forwards(link: Link) -> None:
    assert await _round_trip(link) == b"ping\n"


async def test_a_cut_holds_without_an_answer_and_the_heal_forwards_again(link: Link) -> None:
    link.partition()
    assert await _round_trip(link, within=0.5) == b""
    link.heal()
    assert await _round_trip(link) == b"ping\n"


async def test_a_one_way_cut_lets_the_connection_open_but_no_request_through(link: Link) -> None:
    link.partition(frozenset({UP}))
    reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
    writer.write(b"held\n")
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(5), 0.5)
    writer.close()
    link.heal()
    assert await _round_trip(link) == b"ping\n"


async def _breaks_an_open_connection(link: Link, impair: Callable[[], None]) -> None:
    """A connection that answered before `impair` fails after it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
    writer.write(b"one\n")
    assert await reader.readexactly(4) == b"one\n"
    impair()
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        writer.write(b"two\n")
        await writer.drain()
        await asyncio.wait_for(reader.readexactly(4), 2)


async def test_a_drop_resets_open_and_new_connections(link: Link) -> None:
    await _breaks_an_open_connection(link, link.drop)
    assert await _round_trip(link) == b""
    link.heal()
    assert await _round_trip(link) == b"ping\n"


async def test_a_reset_breaks_open_connections_and_lets_new_ones_through(link: Link) -> None:
    await _breaks_an_open_connection(link, link.reset)
    assert await _round_trip(link) == b"ping\n"


async def test_a_delay_makes_each_chunk_late_but_whole_and_in_order(link: Link) -> None:
    link.delay(0.3)
    started = time.monotonic()
    assert await _round_trip(link, b"".join(b"%d," % n for n in range(1000))) == b"".join(b"%d," % n for n in range(1000))
    assert time.monotonic() - started >= 0.6  # 0.3 s up and 0.3 s down
    link.heal()
    assert await _round_trip(link) == b"ping\n"


async def test_isolating_a_member_holds_only_the_connections_it_opens(link: Link) -> None:
    link.isolate("8e9e05c52164694d")
    assert await _round_trip(link, b"POST /raft HTTP/1.1\r\nX-Server-From: 8e9e05c52164694d\r\n\r\n", within=0.5) == b""
    other = b"POST /raft HTTP/1.1\r\nX-Server-From: 91bc3c398fb3c146\r\n\r\n"
    assert await _round_trip(link, other) == other
    link.heal()
    assert await _round_trip(link, b"X-Server-From: 8e9e05c52164694d\r\n") == b"X-Server-From: 8e9e05c52164694d\r\n"


async def test_a_link_whose_port_was_taken_since_it_was_found_free_listens_on_another() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    taken = await asyncio.start_server(_echo, "127.0.0.1", stable_port())
    port = taken.sockets[0].getsockname()[1]
    one = Link(port, server.sockets[0].getsockname()[1])
    try:
        await one.start()
        assert one.port != port
        assert await _round_trip(one) == b"ping\n"
    finally:
        await one.close()
        taken.close()
        server.close()


def test_a_stable_port_is_never_handed_out_twice_in_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    port = stable_port()
    monkeypatch.setenv("EXPORTER_STABLE_PORTS", f"{port}-{port + 1}")
    monkeypatch.setattr(etcd_cluster, "_HANDED_OUT", set())
    assert stable_port() == port
    with pytest.raises(RuntimeError, match="no free port"):
        stable_port()
