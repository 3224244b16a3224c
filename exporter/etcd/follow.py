"""Follow a prefix: list it, then watch it from the listing's revision; list again after any failure."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from loguru import logger

from ..errors import EtcdError
from .store import EtcdStore
from .types import KeyValue, WatchEvent


async def follow_prefix(
    etcd: EtcdStore, prefix: str, on_listing: Callable[[list[KeyValue]], None],
    on_events: Callable[[list[WatchEvent]], None], *, idle_timeout: float = 60,
) -> None:
    """Call `on_listing` with every key under `prefix`, then `on_events` with each change, until cancelled.

    After a broken watch (etcd restarted, compaction) the prefix is listed again, with a backoff
    of 0.2 s doubling up to 5 s, so the caller always ends up with the current state.
    """
    backoff = 0.2
    while True:
        try:
            page = await etcd.range_prefix(prefix)
            on_listing(page.kvs)
            async for events in etcd.watch_prefix(prefix, page.revision + 1, idle_timeout=idle_timeout):
                on_events(events)
                backoff = 0.2
        except EtcdError as exc:
            logger.debug("watch on {} ended ({}); re-listing", prefix, exc.title)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
