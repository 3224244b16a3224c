"""`/v1/convergence`: does the Traefik next to this sidecar serve what is committed? (docs/convergence.md)"""

from __future__ import annotations

from aiohttp import web

from ..traefik.observer import TraefikObserver


def convergence_routes(observer: TraefikObserver | None) -> list[web.RouteDef]:
    """The route; without an observer (`traefik.api_url` unset) `traefik` is null and `roots` empty: unknown."""

    async def convergence(_request: web.Request) -> web.Response:
        if observer is None:
            return web.json_response({"traefik": None, "roots": []})
        return web.json_response({"traefik": observer.api.url, "roots": [v.to_json() for v in observer.roots()]})

    return [web.get("/v1/convergence", convergence)]
