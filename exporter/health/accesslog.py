"""Traefik's JSON access log as a stream of proxied requests: follow the file, classify each line.

The follower starts at the end of the file (a restart never replays old lines), reads what is
appended, follows a rotation (the path names a new file: the old one is read to its end first)
and a truncation (the file got shorter: read again from its start). A line that is not JSON, or
that names no upstream server (a 404 without a router, an internal service), is skipped.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from loguru import logger

# Traefik writes "<name>@<provider>"; only the etcd provider's services are the exporter's.
_PROVIDER = "@etcd"
# A client that went away is not the server's fault (Traefik logs 499 with no origin status).
_CLIENT_CLOSED = 499


@dataclass(frozen=True, slots=True)
class Request:
    """One request Traefik sent to an upstream server of an etcd-provided service."""

    service: str
    url: str
    failed: bool


def classify(line: bytes, failure_statuses: frozenset[int]) -> Request | None:
    """The request one access-log line records, or None when it is not one of ours.

    Failed: the server's status (`OriginStatus`) is a failure status, or Traefik could not
    deliver the request at all (no or zero `OriginStatus`) and the client did not go away.
    """
    if b'"ServiceURL"' not in line:
        return None
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    service, url = entry.get("ServiceName"), entry.get("ServiceURL")
    if not isinstance(service, str) or not isinstance(url, str) or not service.endswith(_PROVIDER):
        return None
    origin = entry.get("OriginStatus") or 0
    failed = origin in failure_statuses if origin else entry.get("DownstreamStatus") != _CLIENT_CLOSED
    return Request(service[: -len(_PROVIDER)], url, failed)


class LogFollower:
    """Yields batches of complete new lines of one file, across rotation and truncation."""

    def __init__(self, path: Path, poll: float = 0.1, chunk: int = 1 << 20) -> None:
        self.path = path
        self._poll = poll
        self._chunk = chunk
        self._file: IO[bytes] | None = None
        self._inode: tuple[int, int] | None = None
        self._partial = b""
        self.rotations = 0
        self.truncations = 0

    def open_at_end(self) -> None:
        """Start after the last line present now (call once, at startup)."""
        self._open(from_end=True)

    async def batches(self) -> AsyncIterator[list[bytes]]:
        """New complete lines as they are appended; waits `poll` seconds when there are none."""
        while True:
            lines = self.read_available()
            if lines:
                yield lines
            else:
                await asyncio.sleep(self._poll)

    def read_available(self) -> list[bytes]:
        """Every complete line appended since the last call (empty when none)."""
        if self._file is None and not self._open(from_end=False):
            return []
        assert self._file is not None
        data = self._file.read(self._chunk)
        if not data:
            self._check_replaced()
            return []
        data, self._partial = self._partial + data, b""
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return [line for line in lines if line]

    def _open(self, from_end: bool) -> bool:
        try:
            handle = self.path.open("rb")
        except OSError:
            return False  # not there yet: Traefik creates it with the first request
        stat = os.fstat(handle.fileno())
        if from_end:
            handle.seek(stat.st_size)
        self._file, self._inode, self._partial = handle, (stat.st_dev, stat.st_ino), b""
        return True

    def _check_replaced(self) -> None:
        # Called at the end of the current file: a new file at the path (rotation) or a shorter
        # one (truncation) means the next lines are elsewhere.
        assert self._file is not None
        try:
            stat = self.path.stat()
        except OSError:
            return  # renamed away and not re-created yet: keep reading the old file
        if (stat.st_dev, stat.st_ino) != self._inode:
            self.rotations += 1
            logger.info("access log {} was rotated; following the new file", self.path)
            self._file.close()
            self._file = None
            self._open(from_end=False)
        elif stat.st_size < self._file.tell():
            self.truncations += 1
            logger.info("access log {} was truncated; reading from its start", self.path)
            self._file.seek(0)
            self._partial = b""

    def close(self) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None
