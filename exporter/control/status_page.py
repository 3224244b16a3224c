"""The operator's status page: `/` and its parts under `/ui/`, server-rendered, updated live by a small script.

Read-only: every route is a GET that changes nothing. Values that came from a push are
attacker-controlled: the templates autoescape, links percent-encode names, and the script
(`static/status.js`) sets text through `textContent` only. The headers that keep it so
(`Content-Security-Policy` without inline scripts, `nosniff`) are added by the control server.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from aiohttp import web
from jinja2 import Environment, PackageLoader, select_autoescape

from ..keys import IngressRef
from .status_view import StatusView

PARTS = ("overview", "convergence", "ingresses", "events")
_STATIC = {"status.js": "text/javascript", "status.css": "text/css", "favicon.svg": "image/svg+xml"}


def _environment() -> Environment:
    return Environment(
        loader=PackageLoader("exporter.control", "templates"), autoescape=select_autoescape(["html"], default=True),
        trim_blocks=True, lstrip_blocks=True,
    )


def _query(request: web.Request) -> tuple[str, bool, int]:
    query = request.query.get("q", "")[:200]
    bad = request.query.get("bad", "") == "1"
    raw = request.query.get("page", "1")
    return query, bad, int(raw) if raw.isdigit() else 1


class StatusPages:
    """The handlers of the page, its parts, `/ui/state.json` and the static files, over one view."""

    def __init__(self, view: StatusView) -> None:
        self._view = view
        self._env = _environment()
        self._static = {name: (files("exporter.control") / "static" / name).read_bytes() for name in _STATIC}

    def routes(self) -> list[web.RouteDef]:
        """Every route (all GETs: the page changes nothing)."""
        return [
            web.get("/", self.index), web.get("/ui/state.json", self.state), web.get("/ui/static/{name}", self.asset),
            web.get("/ui/ingress/{authority}/{id}", self.ingress), web.get("/ui/{part}", self.part),
        ]

    def _page(self, request: web.Request, parts: tuple[str, ...], title: str) -> web.Response:
        query, bad, number = _query(request)
        view = self._view
        rows = view.rows()
        html = self._env.get_template("page.html").render(
            title=title, live=True, parts=parts, overview=view.overview(rows), roots=view.roots(),
            page=view.page(query, bad, number, rows), query=query, bad=bad, events=view.events.recent(20),
        )
        return web.Response(text=html, content_type="text/html")

    async def index(self, request: web.Request) -> web.Response:
        """`/`: every section."""
        return self._page(request, PARTS, "status")

    async def part(self, request: web.Request) -> web.Response:
        """`/ui/<part>`: one section."""
        name = request.match_info["part"]
        if name not in PARTS:
            raise web.HTTPNotFound(text=f"no part {name!r}; the parts are {', '.join(PARTS)}")
        return self._page(request, (name,), name)

    async def ingress(self, request: web.Request) -> web.Response:
        """`/ui/ingress/<authority>/<id>`: one ingress."""
        ref = IngressRef(request.match_info["authority"], request.match_info["id"])
        detail = self._view.ingress(ref)
        if detail is None:
            raise web.HTTPNotFound(text="no such ingress")
        html = self._env.get_template("ingress.html").render(
            title=f"ingress {ref}", live=False, detail=detail, record_json=json.dumps(detail["record"], indent=2, sort_keys=True),
        )
        return web.Response(text=html, content_type="text/html")

    async def state(self, request: web.Request) -> web.Response:
        """`/ui/state.json`: what the live updates (and `status`) read."""
        query, bad, number = _query(request)
        view = self._view
        rows = view.rows()
        chosen = view.page(query, bad, number, rows)
        body: dict[str, Any] = {
            "overview": view.overview(rows), "roots": view.roots(),
            "page": {"rows": [r.to_json() for r in chosen.rows], "total": chosen.total, "matching": chosen.matching,
                     "page": chosen.page, "pages": chosen.pages},
            "events": [e.to_json() for e in view.events.recent(20)],
        }
        return web.json_response(body)

    async def asset(self, request: web.Request) -> web.Response:
        """`/ui/static/<name>`: the script, the style sheet, the icon."""
        name = request.match_info["name"]
        if name not in self._static:
            raise web.HTTPNotFound()
        return web.Response(body=self._static[name], content_type=_STATIC[name], headers={"Cache-Control": "no-cache"})
