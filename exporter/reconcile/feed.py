"""The one ordered feed of etcd's changes: a single watch over one key range, one generation per listing.

etcd orders and keeps whole the revisions of one watch, and promises nothing across two, so
the roots and the records come through one watch: over the range from the lower of the two
prefixes to the end of the higher (docs/writer.md says what else that range holds). Each
listing starts a generation: the watch starts right after the listing's revision, and a
message of an older generation is dropped, as Kubernetes' reflector does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from loguru import logger

from ..errors import EtcdError, WatchCanceled
from ..etcd.store import EtcdStore
from ..etcd.types import WatchEvent, range_end
from ..keys import KeyLayout
from ..supervisor import Supervisor

_BACKOFF_MAX = 5.0


def watched_range(layout: KeyLayout) -> tuple[str, str]:
    """The key range [low, high) the feed watches: both the roots prefix and the records prefix."""
    prefixes = (layout.roots_prefix, layout.records_dir)
    high = max(range_end(p) for p in prefixes)
    return min(prefixes), high.decode("utf-8", "surrogateescape")


class Feed:
    """Delivers each watch message of the current generation to `deliver(generation, events)`.

    `deliver` returns False when the message cannot be applied (out of order): the feed stops
    until the next listing. `position()` is the revision the watch resumes after when its
    stream breaks (the mirror's). `on_canceled` is told that etcd canceled the watch (its
    revision was compacted): only a new listing helps.
    """

    def __init__(
        self, etcd: EtcdStore, layout: KeyLayout, *, deliver: Callable[[int, list[WatchEvent]], Awaitable[bool]],
        position: Callable[[], int], on_canceled: Callable[[], None], idle_timeout: float, supervisor: Supervisor,
    ) -> None:
        self._etcd = etcd
        self.low, self.high = watched_range(layout)
        self._deliver = deliver
        self._position = position
        self._on_canceled = on_canceled
        self._idle_timeout = idle_timeout
        self._supervisor = supervisor
        self.generation = 0
        self._task: asyncio.Task[None] | None = None
        self._started = False

    def start(self) -> None:
        """Watch from now on, from each listing's revision (the first listing may come later)."""
        self._started = True
        if self.generation:
            self._spawn()

    def listed(self) -> int:
        """A listing replaced the mirror: a new generation starts, watching right after it; returns it."""
        self.generation += 1
        if self._started:
            self._spawn()
        return self.generation

    async def stop(self) -> None:
        """Stop watching."""
        self._started = False
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _spawn(self) -> None:
        if self._task is not None:
            self._task.cancel()
        generation = self.generation
        self._task = self._supervisor.spawn(f"watch {self.low}..", lambda: self._watch(generation), group="watch")

    async def _watch(self, generation: int) -> None:
        backoff = 0.1
        while generation == self.generation:
            start = self._position() + 1
            try:
                async for events in self._etcd.watch_prefix(self.low, start, idle_timeout=self._idle_timeout, end=self.high):
                    if generation != self.generation or not await self._deliver(generation, events):
                        return
                    backoff = 0.1
            except WatchCanceled as exc:
                logger.warning("watch canceled at compacted revision {}: listing again", exc.compact_revision)
                self._on_canceled()
                return
            except EtcdError as exc:
                # etcd's watches resume: from the mirror's revision on, nothing is lost.
                logger.debug("watch ended ({}); resuming after revision {}", exc.title, self._position())
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)
