"""The coordinator's revision rules for requests (pure), by the one revision order (`supersedes`)."""

from __future__ import annotations

from typing import Literal

from ..errors import StaleRevisionError
from .records import Record, Removal, supersedes, tombstone


def classify_upsert(stored: Record | None, incoming: Record) -> Literal["noop", "apply"]:
    """`noop` for a retry of what is stored, `apply` for a newer revision; raise on a stale one."""
    if stored is None or supersedes(incoming.revision, False, stored):
        return "apply"
    if not stored.removed and incoming.revision == stored.revision and incoming.content == stored.content:
        return "noop"
    authority, ingress_id = incoming.key
    if stored.removed:
        why = f"is not newer than its removal at {stored.revision}"
    elif incoming.revision < stored.revision:
        why = f"is lower than the stored {stored.revision}"
    else:
        why = "is stored with different content"
    raise StaleRevisionError(
        f"ingress {authority}/{ingress_id}: revision {incoming.revision} {why}",
        {"authority": authority, "id": ingress_id, "stored_revision": stored.revision},
    )


def tombstone_revision(stored: Record | None, authority: str, ingress_id: str, revision: int | None) -> int | None:
    """The revision of the tombstone a remove commits; None for a no-op; raise when a live record is newer.

    A remove that supersedes what is stored (nothing stored counts as older than any remove)
    commits a tombstone at its revision, so an acknowledged remove at R refuses every later
    upsert at or below R; one at or below a stored tombstone's revision is a retry. A remove
    without a revision removes whatever is stored, at its revision (nothing stored, or a
    tombstone: a no-op).
    """
    if revision is None:
        return None if stored is None or stored.removed else stored.revision
    if stored is None or supersedes(revision, True, stored):
        return revision
    if stored.removed:
        return None
    raise StaleRevisionError(
        f"ingress {authority}/{ingress_id}: remove at revision {revision} is older than the stored {stored.revision}",
        {"authority": authority, "id": ingress_id, "stored_revision": stored.revision},
    )


def removal_record(stored: Record | None, removal: Removal, now: float) -> Record | None:
    """The record a remove asks for, at time `now`: a new tombstone, or the stored tombstone it repeats
    (a retry, answered once that one is committed: it may be pending); None when nothing is stored
    and the remove has no revision. Raise when it is stale."""
    revision = tombstone_revision(stored, *removal.ref, removal.revision)
    if revision is None:
        return stored
    return stored.removal(revision, now) if stored is not None else tombstone(removal.ref, revision, now)
