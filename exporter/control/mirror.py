"""`/v1/mirror`: the revision this sidecar's view of etcd is a copy of, and a digest to compare with etcd (docs/operations.md)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from ..reconcile.mirror import MirrorSummary


def mirror_routes(summary: Callable[[], MirrorSummary]) -> list[web.RouteDef]:
    """The route: `{"revision", "prefixes", "keys", "digest"}`, all taken from the mirror in one step."""

    async def mirror(_request: web.Request) -> web.Response:
        found = summary()
        return web.json_response(
            {"revision": found.revision, "prefixes": list(found.prefixes), "keys": found.keys, "digest": found.digest}
        )

    return [web.get("/v1/mirror", mirror)]
