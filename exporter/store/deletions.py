"""Deletions the watches may not have delivered yet, so that an older put arriving later is refused.

The mirror is fed out of revision order: a watch event deferred while our own transactions
were in flight, or a re-read sent before our commit and answered after it, can carry a put
older than a delete the mirror already took. A deleted key leaves nothing in the mirror to
compare with, so its revision is kept here until both watches have delivered past it, and
while a re-read is out, until it is answered: a read pinned to a revision the watches have
since passed carries the puts those watches deleted (`held`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager


class Deletions:
    """Deleted keys with the revision of their deletion, oldest first."""

    def __init__(self) -> None:
        self._gone: OrderedDict[str, int] = OrderedDict()
        # The floors of the re-reads out (see `held`).
        self._holds: list[int] = []

    def deleted(self, key: str, revision: int) -> None:
        """`key` was deleted at `revision` (or read absent there)."""
        self._gone.pop(key, None)
        self._gone[key] = revision

    def put(self, key: str) -> None:
        """`key` exists again."""
        self._gone.pop(key, None)

    def at(self, key: str) -> int:
        """The revision `key` was last known deleted at (0: none known)."""
        return self._gone.get(key, 0)

    @contextmanager
    def held(self, floor: int) -> Iterator[None]:
        """Keep every deletion after `floor` while a read is out that is pinned at `floor` or later.

        Such a read sees every key deleted at `floor` or before as deleted (or put again,
        newer); a key deleted after its revision it returns with its older put.
        """
        self._holds.append(floor)
        try:
            yield
        finally:
            self._holds.remove(floor)

    def forget_through(self, revision: int) -> None:
        """Drop the deletions at `revision` or before (both watches have delivered them), none a read out may contradict."""
        if self._holds:
            revision = min(revision, *self._holds)
        gone = self._gone
        while gone:
            key, deleted = next(iter(gone.items()))
            if deleted > revision:
                return
            del gone[key]

    def clear(self) -> None:
        """Forget everything (a full read replaces the mirror)."""
        self._gone.clear()

    def __len__(self) -> int:
        return len(self._gone)
