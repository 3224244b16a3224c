"""The etcd history of a campaign, recorded live: a watch on the whole keyspace through any member
that answers, resumed after the last revision seen when its member dies.

Compaction would erase history not yet read, so the campaign compacts only up to `seen`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

import aiohttp

from exporter.etcd.types import b64, unb64

ChangeSet = dict[str, str | None]


class Recorder:
    """Every etcd revision after `start` with the keys it put (value) or deleted (None)."""

    def __init__(self, http: aiohttp.ClientSession, endpoints: Callable[[], list[str]], start: int) -> None:
        self.http, self.endpoints = http, endpoints
        self.seen = start
        self.revisions: dict[int, ChangeSet] = {}
        self.resumed = 0

    async def run(self) -> None:
        """Watch until cancelled, moving to the next member whenever a stream breaks."""
        n = 0
        while True:
            url = self.endpoints()[n % 3]
            n += 1
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                await self._watch(url)
            self.resumed += 1
            await asyncio.sleep(0.1)

    async def _watch(self, url: str) -> None:
        body = {"create_request": {"key": b64("\0"), "range_end": b64("\0"), "start_revision": str(self.seen + 1),
                                   "progress_notify": True}}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=2, sock_read=15)
        async with self.http.post(f"{url}/v3/watch", json=body, timeout=timeout) as resp:
            # One message holds every event of a batch of revisions: a catch-up after a resume is large.
            while line := await resp.content.readline(max_line_length=256 * 1024 * 1024):
                result = json.loads(line).get("result", {})
                if result.get("canceled"):
                    raise ValueError(f"watch canceled: {result.get('cancel_reason')}")
                for event in result.get("events") or []:
                    kv = event["kv"]
                    revision = int(kv["mod_revision"])
                    key = unb64(kv["key"])
                    value = None if event.get("type") == "DELETE" else "" if key.startswith("campaign/") else unb64(kv.get("value"))
                    self.revisions.setdefault(revision, {})[key] = value  # the nospace fault's MiBs are not kept
                    # Every event of a revision comes in one message: the revision is complete.
                    self.seen = max(self.seen, revision)

    async def until(self, revision: int, timeout: float) -> None:
        """Wait until `revision` has been recorded."""
        async with asyncio.timeout(timeout):
            while self.seen < revision:
                await asyncio.sleep(0.05)

    def history(self) -> list[tuple[int, ChangeSet]]:
        return sorted(self.revisions.items())
