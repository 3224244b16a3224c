"""The coordinator's revision rules for requests (pure), by the one revision order (`supersedes`)."""

from __future__ import annotations

from typing import Literal

from ..errors import StaleRevisionError
from .records import Record, supersedes


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


def classify_remove(stored: Record | None, authority: str, ingress_id: str, revision: int | None) -> Literal["noop", "apply"]:
    """`noop` for an unknown or already removed ingress; raise when the remove is older than what is stored.

    A remove without a revision removes whatever is stored.
    """
    if stored is None or stored.removed:
        return "noop"
    if revision is not None and not supersedes(revision, True, stored):
        raise StaleRevisionError(
            f"ingress {authority}/{ingress_id}: remove at revision {revision} is older than the stored {stored.revision}",
            {"authority": authority, "id": ingress_id, "stored_revision": stored.revision},
        )
    return "apply"
