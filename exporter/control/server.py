"""The control server: /healthz, /readyz, /metrics (and, with the health engine, /v1/healthcheck)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Readiness = Callable[[], list[str]]


def control_app(
    readiness: Readiness, registry: CollectorRegistry, extra_routes: list[web.RouteDef] | None = None,
    middlewares: list[Middleware] | None = None,
) -> web.Application:
    """The aiohttp application; `readiness` returns the reasons the daemon is not ready (empty: ready);
    /metrics serves `registry`."""

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_request: web.Request) -> web.Response:
        reasons = readiness()
        if reasons:
            return web.json_response({"status": "not ready", "reasons": reasons}, status=503)
        return web.json_response({"status": "ready", "reasons": []})

    async def metrics(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(middlewares=middlewares or [])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    if extra_routes:
        app.router.add_routes(extra_routes)
    return app
