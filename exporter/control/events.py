"""Recent events an operator asks about: health transitions, conflicts, refused pushes, leadership, Traefik states.

An in-memory ring (the newest `size`), served as `GET /v1/events` for tooling and shown on the
status page. Nothing here is durable: the log has everything; this is what happened lately.
Values that came from a push (ids, authorities, URLs) are kept as text; whoever shows them escapes them.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from aiohttp import web

from ..errors import ExporterError, StaleRevisionError
from ..health.notify import Transitions
from ..keys import IngressRef

Kind = Literal["health", "conflict", "refused", "leadership", "traefik"]


@dataclass(frozen=True, slots=True)
class Event:
    """One event: its sequence number, when, what kind, the ingress it concerns (if any) and a sentence."""

    seq: int
    at: str
    kind: Kind
    text: str
    authority: str | None = None
    id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON shape of `/v1/events` entries."""
        return {"seq": self.seq, "at": self.at, "kind": self.kind, "authority": self.authority, "id": self.id, "text": self.text}


class EventRing:
    """The newest events, oldest first; health transitions are passed on to `forward` (the notifier)."""

    def __init__(self, size: int = 500, forward: Transitions | None = None) -> None:
        self._events: deque[Event] = deque(maxlen=size)
        self._seq = itertools.count(1)
        self._forward = forward

    def add(self, kind: Kind, text: str, ref: IngressRef | None = None) -> None:
        """Record one event now."""
        at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        self._events.append(Event(next(self._seq), at, kind, text, ref.authority if ref else None, ref.id if ref else None))

    def recent(self, limit: int | None = None, ref: IngressRef | None = None) -> list[Event]:
        """The newest events first (only those of `ref` when given), at most `limit`."""
        chosen: Iterable[Event] = reversed(self._events)
        if ref is not None:
            chosen = (e for e in chosen if e.authority == ref.authority and e.id == ref.id)
        return list(itertools.islice(chosen, limit))

    def transition(self, owner: IngressRef, node: str, routed: bool, reason: str) -> None:
        """A health transition (the health engine's `Transitions` role)."""
        self.add("health", f"{node} {'back in rotation' if routed else 'out of rotation'} ({reason})", owner)
        if self._forward is not None:
            self._forward.transition(owner, node, routed, reason)

    def refused(self, error: ExporterError) -> None:
        """A push answered 400 or 409 (its title names the ingress and the reason, never a secret)."""
        data = error.data
        ref = IngressRef(str(data["authority"]), str(data["id"])) if "authority" in data and "id" in data else None
        self.add("conflict" if isinstance(error, StaleRevisionError) else "refused", error.title, ref)


def events_routes(ring: EventRing) -> list[web.RouteDef]:
    """`GET /v1/events[?limit=N]`: the newest events first."""

    async def events(request: web.Request) -> web.Response:
        raw = request.query.get("limit", "100")
        if not raw.isdigit() or not 1 <= int(raw) <= 1000:
            error = {"type": "ValidationFailed", "title": "limit: must be an integer from 1 to 1000", "data": {}}
            return web.json_response(error, status=400)
        return web.json_response({"events": [e.to_json() for e in ring.recent(int(raw))]})

    return [web.get("/v1/events", events)]
