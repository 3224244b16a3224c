"""The coordinator's revision rules (pure)."""

from __future__ import annotations

from typing import Literal

from ..errors import StaleRevisionError
from .records import Record


def classify_upsert(stored: Record | None, incoming: Record) -> Literal["noop", "apply"]:
    """`noop` for a retry of what is stored, `apply` for a newer revision; raise on a stale one."""
    if stored is None:
        return "apply"
    authority, ingress_id = incoming.key
    if stored.removed:
        if incoming.revision <= stored.revision:
            raise StaleRevisionError(
                f"ingress {authority}/{ingress_id}: revision {incoming.revision} is not newer than its removal at {stored.revision}",
                {"authority": authority, "id": ingress_id, "stored_revision": stored.revision},
            )
        return "apply"
    if incoming.revision < stored.revision:
        raise StaleRevisionError(
            f"ingress {authority}/{ingress_id}: revision {incoming.revision} is lower than the stored {stored.revision}",
            {"authority": authority, "id": ingress_id, "stored_revision": stored.revision},
        )
    if incoming.revision == stored.revision:
        if incoming.content == stored.content:
            return "noop"
        raise StaleRevisionError(
            f"ingress {authority}/{ingress_id}: revision {incoming.revision} is stored with different content",
            {"authority": authority, "id": ingress_id, "stored_revision": stored.revision},
        )
    return "apply"


def classify_remove(stored: Record | None, authority: str, ingress_id: str, revision: int | None) -> Literal["noop", "apply"]:
    """`noop` for an unknown or already removed ingress; raise when the remove is older than what is stored.

    A remove without a revision removes whatever is stored.
    """
    if stored is None or stored.removed:
        return "noop"
    if revision is not None and revision < stored.revision:
        raise StaleRevisionError(
            f"ingress {authority}/{ingress_id}: remove at revision {revision} is older than the stored {stored.revision}",
            {"authority": authority, "id": ingress_id, "stored_revision": stored.revision},
        )
    return "apply"
