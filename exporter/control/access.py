"""Who may read the control server: everyone on loopback; beyond it, the push API's credentials.

Monitoring scrapes a few paths without credentials (`control.open_paths`: by default
`/healthz`, `/readyz`, `/metrics` and `/v1/healthcheck`, APISIX's monitoring contract). Every
other page and JSON asks for the API token (`Authorization: Bearer`, or the cookie the login
form sets: a keyed digest of the token, never the token itself). Every answer carries
`X-Content-Type-Options: nosniff`, and HTML a `Content-Security-Policy` that allows only the
daemon's own script and style (no inline script, nothing from elsewhere).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware

from ..errors import Unauthorized
from ..sources.auth import Authenticator

COOKIE = "exporter_status"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_LOGIN = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>log in · traefik-etcd-exporter</title>
<link rel="stylesheet" href="/ui/static/status.css"><link rel="icon" href="/ui/static/favicon.svg"></head>
<body><main><h1>traefik-etcd-exporter</h1>
<form method="post" action="/ui/login"><label>API token <input type="password" name="token" autocomplete="off"></label>
<button type="submit">Log in</button></form></main></body></html>"""


def _is_open(path: str, open_paths: Sequence[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in open_paths)


def security_headers() -> Middleware:
    """nosniff on every answer; the content security policy on HTML."""

    @web.middleware
    async def middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            _secure(exc)
            raise
        _secure(response)
        return response

    return middleware


def _secure(response: web.StreamResponse) -> None:
    response.headers["X-Content-Type-Options"] = "nosniff"
    if response.content_type == "text/html":
        response.headers["Content-Security-Policy"] = CSP
        response.headers["Referrer-Policy"] = "no-referrer"


def token_required(token: str | None, jwt_secret: str | None, open_paths: Sequence[str]) -> tuple[Middleware, list[web.RouteDef]]:
    """The middleware asking for the API's credentials outside `open_paths`, and the login form's routes."""
    auth = Authenticator(token, jwt_secret)
    cookie = hmac.new((token or jwt_secret or "").encode(), b"status page", hashlib.sha256).hexdigest()

    @web.middleware
    async def middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
        if _is_open(request.path, open_paths) or request.path in ("/ui/login", "/ui/static/status.css", "/ui/static/favicon.svg"):
            return await handler(request)
        if hmac.compare_digest(request.cookies.get(COOKIE, ""), cookie):
            return await handler(request)
        try:
            auth.check(request.headers)
        except Unauthorized as exc:
            if "text/html" in request.headers.get("Accept", ""):
                return web.Response(text=_LOGIN, content_type="text/html", status=401)
            return web.json_response(exc.to_json(), status=401)
        return await handler(request)

    async def form(_request: web.Request) -> web.Response:
        return web.Response(text=_LOGIN, content_type="text/html")

    async def login(request: web.Request) -> web.Response:
        data = await request.post()
        given = str(data.get("token", ""))
        try:
            auth.check({"Authorization": f"Bearer {given}"})
        except Unauthorized as exc:
            return web.json_response(exc.to_json(), status=401)
        response = web.HTTPFound("/")
        response.set_cookie(COOKIE, cookie, httponly=True, samesite="Strict", secure=request.secure, path="/")
        raise response

    return middleware, [web.get("/ui/login", form), web.post("/ui/login", login)]
