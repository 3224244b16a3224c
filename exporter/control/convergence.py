"""`/v1/convergence`: does the Traefik next to this sidecar serve what is committed? (docs/convergence.md)"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from ..traefik.observer import TraefikObserver
from ..write.pacer import Backlog


def convergence_routes(
    observer: TraefikObserver | None, overlapping: Callable[[], list[tuple[str, str]]] = list,
    backlog: Callable[[str], Backlog] | None = None,
) -> list[web.RouteDef]:
    """The route; without an observer (`traefik.api_url` unset) `traefik` is null and `roots` empty: unknown.

    `overlapping_roots` lists the roots written here that are string prefixes of others (each a
    Traefik woken by the other's writes); each root's `paced` is what `backlog` holds for it.
    """

    async def convergence(_request: web.Request) -> web.Response:
        overlaps = [{"root": outer, "prefix_of": inner} for outer, inner in overlapping()]
        if observer is None:
            return web.json_response({"traefik": None, "roots": [], "overlapping_roots": overlaps})
        roots = [v.to_json() for v in observer.roots()]
        for root in roots:
            if backlog is None:
                break
            held = backlog(root["root"])
            root["paced"] = {"ingresses": held.ingresses, "oldest_seconds": held.oldest_seconds}
        return web.json_response({"traefik": observer.api.url, "roots": roots, "overlapping_roots": overlaps})

    return [web.get("/v1/convergence", convergence)]
