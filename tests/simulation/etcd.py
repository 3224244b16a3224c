"""The in-memory etcd whose every answer is a step the simulation schedules.

Each call (a transaction, a range read) waits until the scheduler answers it, loses its reply
after it committed, or fails it; each watch stream hands over what the scheduler delivers, one
or more whole revisions a message, or breaks. Everything else is the contract-tested fake's
(tests/fake_etcd.py), so revisions, compares and compaction are etcd's.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.errors import EtcdError, WatchCanceled
from exporter.etcd.types import Compare, KeyValue, Op, RangePage, TxnResult, WatchEvent, range_end
from tests.fake_etcd import FakeEtcd


@dataclass(eq=False)
class Call:
    """A call waiting for its answer: `act` does it on the fake when the scheduler answers."""

    kind: str
    act: Callable[[], Awaitable[Any]]
    # A transaction's: the sidecar that sent it, and its operations (key, value; None: a delete).
    owner: int | None = None
    ops: list[tuple[str, str | None]] = field(default_factory=list)
    future: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass(eq=False)
class Stream:
    """One watch stream: the key range, the newest revision handed over, what waits to be read."""

    low: str
    high: str
    cursor: int
    queue: asyncio.Queue[list[WatchEvent] | BaseException] = field(default_factory=asyncio.Queue)


class SimEtcd(FakeEtcd):
    """A fake etcd answering only when the scheduler says so."""

    def __init__(self, max_txn_ops: int, prefixes: tuple[str, ...]) -> None:
        super().__init__(max_txn_ops=max_txn_ops)
        self.calls: list[Call] = []
        self.streams: list[Stream] = []
        # Every change ever made, kept through compactions: (revision, key, value; None for a delete).
        self.log: list[tuple[int, str, str | None]] = []
        self._logged: list[int] = []  # the revision of each entry of `log`, to bisect
        # What the mirrors hold: the keys under `prefixes` now, and their digest at every revision.
        self._prefixes = prefixes
        self._mirrored: dict[str, tuple[str, int]] = {}
        self.digests: dict[int, str] = {self.revision: digest({})}

    # ----- the calls the scheduler answers

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op], owner: int | None = None) -> TxnResult:
        call = Call("txn", lambda: FakeEtcd.txn(self, compares, ops), owner, [(op.key, op.value) for op in ops])
        self.calls.append(call)
        return await call.future  # type: ignore[no-any-return]

    async def range_prefix(self, prefix: str, *, revision: int = 0) -> RangePage:
        # Pages of one key, each a step: the client pins every page to the first one's revision,
        # so a compaction in between fails the read as it would on etcd.
        page: RangePage = await self._call(Call("range", lambda: FakeEtcd.range_prefix(self, prefix, revision=revision)))
        for _more in page.kvs[1:]:
            await self._call(Call("page", lambda: FakeEtcd.range_prefix(self, prefix, revision=page.revision)))
        return page

    async def get_at(self, key: str, revision: int = 0) -> tuple[KeyValue | None, int]:
        return await self._call(Call("get", lambda: FakeEtcd.get_at(self, key, revision)))  # type: ignore[no-any-return]

    async def _call(self, call: Call) -> Any:
        self.calls.append(call)
        return await call.future

    async def answer(self, call: Call, outcome: str) -> None:
        """Answer `call`: "ok", "lost" (done, but the reply never arrives) or "fail" (not done)."""
        self.calls.remove(call)
        if outcome == "fail":
            call.future.set_exception(EtcdError("simulated: etcd unreachable", unavailable=True))
            return
        try:
            result = await call.act()
        except EtcdError as exc:
            call.future.set_exception(exc)
            return
        if outcome == "lost":
            call.future.set_exception(EtcdError("simulated: the reply was lost", unavailable=True))
        else:
            call.future.set_result(result)

    # ----- watches

    async def watch_prefix(
        self, prefix: str, start_revision: int, idle_timeout: float, *, end: str | None = None
    ) -> AsyncIterator[list[WatchEvent]]:
        self.watch_starts.append((prefix, start_revision))
        if start_revision <= self.compacted:
            raise WatchCanceled("required revision has been compacted", self.compacted)
        stream = Stream(prefix, end if end is not None else range_end(prefix).decode(), start_revision - 1)
        self.streams.append(stream)
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.streams.remove(stream)

    def undelivered(self, stream: Stream, limit: int = 1 << 30) -> list[tuple[int, str, str | None]]:
        """The changes in the stream's range after its cursor, of its next `limit` revisions."""
        out: list[tuple[int, str, str | None]] = []
        revisions: set[int] = set()
        for rev, key, value in self.log[bisect.bisect_right(self._logged, stream.cursor):]:
            if not stream.low <= key < stream.high:
                continue
            if rev not in revisions:
                if len(revisions) == limit:
                    break
                revisions.add(rev)
            out.append((rev, key, value))
        return out

    def deliver(self, stream: Stream, revisions: int) -> None:
        """Hand over the next `revisions` whole revisions in the stream's range as one message."""
        changes = self.undelivered(stream, revisions)
        stream.cursor = changes[-1][0]
        stream.queue.put_nowait([WatchEvent.of(key, value, rev) for rev, key, value in changes])

    def break_stream(self, stream: Stream) -> None:
        """The stream breaks (a network fault): the watcher resumes or lists again."""
        stream.queue.put_nowait(EtcdError("simulated: the watch stream broke", unavailable=True))
        stream.cursor = 1 << 62  # nothing more is delivered on it

    def compact(self) -> None:
        """Compact at the current revision: a stream behind it is canceled."""
        super().compact()
        for stream in self.streams:
            if stream.cursor < self.compacted:
                stream.queue.put_nowait(WatchCanceled("required revision has been compacted", self.compacted))
                stream.cursor = 1 << 62

    async def _write(self, ops: Sequence[Op]) -> None:
        changes = [op for op in ops if op.value is not None or op.key in self._kv]
        await super()._write(ops)
        if not changes:
            return
        for op in changes:
            self.log.append((self.revision, op.key, op.value))
            self._logged.append(self.revision)
            if op.key.startswith(self._prefixes):
                if op.value is None:
                    self._mirrored.pop(op.key, None)
                else:
                    self._mirrored[op.key] = (op.value, self.revision)
        self.digests[self.revision] = digest(self._mirrored)


def digest(held: dict[str, tuple[str, int]]) -> str:
    """The digest `GET /v1/mirror` gives for these keys (docs/operations.md), computed here independently."""
    sha = hashlib.sha256()
    for key in sorted(held, key=str.encode):
        value, mod = held[key]
        sha.update(key.encode() + b"\0" + value.encode() + b"\0" + str(mod).encode() + b"\n")
    return sha.hexdigest()
