"""Our own commits not yet delivered by the watch: how the mirror tells them from anyone else's.

The writer's reply names the revision of each transaction that committed; when the watch
delivers that revision the mirror applies it from the operations kept here (records as the
objects that were written, never decoded again) and reports nothing as drift.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..keys import IngressRef
from .records import Record


@dataclass(frozen=True, slots=True)
class OwnCommit:
    """One transaction of ours: its key changes (key, new value; None: deleted), beacons included, and the records it wrote."""

    changes: Sequence[tuple[str, str | None]]
    records: Mapping[IngressRef, Record | None]


class OwnCommits:
    """Our commits by revision, from their reply until the watch delivers them."""

    def __init__(self) -> None:
        self._commits: dict[int, OwnCommit] = {}
        # The newest revision we committed at.
        self.newest = 0

    def add(self, revision: int, commit: OwnCommit) -> None:
        """A transaction of ours committed at `revision`."""
        self._commits[revision] = commit
        self.newest = max(self.newest, revision)

    def take(self, revision: int) -> OwnCommit | None:
        """The commit of ours at `revision` (None: someone else's), forgotten once taken."""
        return self._commits.pop(revision, None)

    def forget_through(self, revision: int) -> None:
        """Forget our commits at `revision` or before (a listing there holds them)."""
        if self._commits:
            self._commits = {r: c for r, c in self._commits.items() if r > revision}

    def __len__(self) -> int:
        return len(self._commits)

    def __contains__(self, revision: object) -> bool:
        return revision in self._commits
