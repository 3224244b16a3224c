"""Deletions the watches may not have delivered yet, so that an older put arriving later is refused.

The mirror is fed out of revision order: a watch event deferred while our own transactions
were in flight, or a re-read sent before our commit and answered after it, can carry a put
older than a delete the mirror already took. A deleted key leaves nothing in the mirror to
compare with, so its revision is kept here until both watches have delivered past it.
"""

from __future__ import annotations

from collections import OrderedDict


class Deletions:
    """Deleted keys with the revision of their deletion, oldest first."""

    def __init__(self) -> None:
        self._gone: OrderedDict[str, int] = OrderedDict()

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

    def forget_through(self, revision: int) -> None:
        """Drop the deletions at `revision` or before (both watches have delivered them)."""
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
