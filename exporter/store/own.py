"""The revisions this writer created: how the watch tells our commits from anyone else's.

Every transaction the writer commits adds its revision here; the watch skips those events
(the mirror took their keys from the reply) without decoding them.
"""

from __future__ import annotations

# Own revisions remembered before the ones the watch has passed are dropped.
_KEPT = 10_000


class OwnRevisions:
    """The etcd revisions created by this writer's transactions."""

    def __init__(self) -> None:
        self._revisions: set[int] = set()
        # The newest of them (what a paused watch must have caught up with, see the mirror).
        self.newest = 0

    def add(self, revision: int) -> None:
        """A transaction of ours committed at `revision`."""
        self._revisions.add(revision)
        self.newest = max(self.newest, revision)

    def __contains__(self, revision: object) -> bool:
        return revision in self._revisions

    def run_after(self, after: int) -> int:
        """The newest revision `r` such that every revision in (`after`, `r`] is one of ours."""
        revision = after
        while revision + 1 in self._revisions:
            revision += 1
        return revision

    def forget_until(self, revision: int) -> None:
        """Forget revisions up to `revision` (the watch has seen them all), once many are kept."""
        if len(self._revisions) > _KEPT:
            self._revisions = {r for r in self._revisions if r > revision}
