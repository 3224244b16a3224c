"""The watches that keep the mirror current: one on the roots, one on the records.

During a bulk of our own writes the watches are paused (`paused_for_bulk`): etcd would only
send our own writes back, at a cost for etcd that a bulk sync feels. On resume a watch skips
the revisions that were all our own commits (etcd's revision grows by one per write, so an
unbroken run of our revisions means nobody else wrote meanwhile) and replays from where it
stopped otherwise.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from loguru import logger

from ..errors import EtcdError, WatchCanceled
from ..etcd.store import EtcdStore
from ..etcd.types import WatchEvent
from ..keys import KeyLayout
from ..store.observed import Observed
from ..supervisor import Supervisor

_BACKOFF_MAX = 5.0


class Watches:
    """Watches the roots and the records from the mirror's revision on; `on_events(events, roots)` gets each message."""

    def __init__(
        self, etcd: EtcdStore, layout: KeyLayout, observed: Observed, on_events: Callable[[list[WatchEvent], bool], None],
        on_stale: Callable[[], None], *, idle_timeout: float, supervisor: Supervisor,
    ) -> None:
        """`on_stale`: etcd canceled a watch (its revision was compacted), so the mirror must be listed again."""
        self._etcd = etcd
        self._layout = layout
        self._observed = observed
        self._on_events = on_events
        self._on_stale = on_stale
        self._idle_timeout = idle_timeout
        self._supervisor = supervisor
        # Set once the mirror holds a full read: the watches start from its revision.
        self.listed = asyncio.Event()
        self._watches: list[asyncio.Task[None]] = []
        # Per watched prefix: the newest revision its watch delivered (or skipped, see above).
        self._positions: dict[str, int] = {}
        self._stopped = False

    def start(self) -> None:
        """(Re)start the watches; after an etcd restart a long-poll watch can block forever without an error."""
        for task in self._watches:
            task.cancel()
        self._watches = [
            self._supervisor.spawn(f"watch {p}", functools.partial(self._watch, p), group="watch") for p in self._watched()
        ]

    def relisted(self, revision: int) -> None:
        """The mirror was read whole at `revision`: every watch resumes right after it.

        Whatever a watch delivered past `revision` while the read was out went with the mirror
        it replaced, so a watch further on is restarted there (one not past it goes on).
        """
        ahead = any(self._positions.get(prefix, 0) > revision for prefix in self._watched())
        for prefix in self._watched():
            self._positions[prefix] = revision
        self.listed.set()
        if ahead and self._watches and not self._stopped:
            self.start()

    async def stop(self) -> None:
        """Stop watching."""
        self._stopped = True
        tasks, self._watches = self._watches, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @asynccontextmanager
    async def paused_for_bulk(self, bulk: bool) -> AsyncIterator[None]:
        """Pause the watches while the body writes (when `bulk`), resuming past our own commits."""
        if not bulk or not self._watches or not self._caught_up():
            yield
            return
        watches, self._watches = self._watches, []
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        try:
            yield
        finally:
            if not self._stopped and not self._watches:
                for prefix in self._watched():
                    self._positions[prefix] = self._resume_at(prefix)
                self.start()

    def _watched(self) -> tuple[str, str]:
        """The prefixes watched: the roots and the records."""
        return self._layout.roots_prefix, self._layout.records_dir

    def _resume_at(self, prefix: str) -> int:
        """Where the watch on `prefix` can resume: past every revision after its position that was our own commit."""
        return self._observed.own.run_after(max(self._positions.get(prefix, 0), self._observed.revision))

    def _caught_up(self) -> bool:
        """True when no watch has anything to replay before our newest commit.

        A watch still replaying (it resumed where it stopped, or another writer wrote) is left
        to stream: stopping it again would only make etcd send the same events once more.
        """
        newest = self._observed.own.newest
        return all(self._resume_at(p) >= newest for p in self._watched())

    async def _watch(self, prefix: str) -> None:
        backoff = 0.1
        await self.listed.wait()
        while True:
            start = max(self._positions.get(prefix, 0), self._observed.revision) + 1
            try:
                async for events in self._etcd.watch_prefix(prefix, start, idle_timeout=self._idle_timeout):
                    self._on_events(events, prefix == self._layout.roots_prefix)
                    last = max(self._positions.get(prefix, 0), *(e.mod_revision for e in events))
                    self._positions[prefix] = last
                    self._observed.own.forget_until(last)
                    backoff = 0.1
            except WatchCanceled as exc:
                logger.warning("watch on {} canceled at compacted revision {}: re-listing", prefix, exc.compact_revision)
                self._on_stale()
            except EtcdError as exc:
                logger.debug("watch on {} ended ({}); resuming", prefix, exc.title)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)
