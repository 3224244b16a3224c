"""`/v1/healthcheck` views (APISIX shape), as JSON or, on `Accept: text/html`, an HTML table."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..health.engine import HealthEngine
from ..keys import IngressRef


def _render(request: web.Request, entries: list[dict[str, Any]], title: str, headers: dict[str, str]) -> web.Response:
    if "text/html" in request.headers.get("Accept", ""):
        rows = []
        for entry in entries:
            for node in entry["nodes"]:
                counter = node["counter"]
                cells = [
                    entry["name"], entry["type"], entry.get("plugin", ""), str(entry.get("meta", "")),
                    f"{node['ip']}:{node['port']}", node["status"], str(counter["success"]),
                    str(counter["http_failure"]), str(counter["tcp_failure"]), str(counter["timeout_failure"]),
                ]
                rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        head = "".join(
            f"<th>{h}</th>"
            for h in ("checker", "type", "plugin", "meta", "node", "status", "success", "http_failure", "tcp_failure", "timeout_failure")
        )
        body = (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>"
            f"<h1>{html.escape(title)}</h1><table border='1'><thead><tr>{head}</tr></thead><tbody>"
            + "".join(rows)
            + "</tbody></table></body></html>"
        )
        return web.Response(text=body, content_type="text/html", headers=headers)
    # An empty list is `[]`, never `{}`.
    return web.json_response(entries, headers=headers)


def healthcheck_routes(
    engine: HealthEngine, exists: Callable[[IngressRef], bool], headers: Callable[[], dict[str, str]] = dict
) -> list[web.RouteDef]:
    """The routes of the health views; `exists` tells whether an ingress is stored.

    `headers` adds `X-Health-Leader` and `X-Health-Age`: whose probes the data comes from.
    """

    async def all_checkers(request: web.Request) -> web.Response:
        return _render(request, engine.checkers(), "health checkers", headers())

    async def one(request: web.Request) -> web.Response:
        owner = IngressRef(request.match_info["authority"], request.match_info["id"])
        resource = request.match_info["resource"]
        if resource != "checkers":
            return web.json_response(
                {"type": "UnknownResource", "title": f"unknown sub-resource {resource!r}; use checkers", "data": {}}, status=400
            )
        if not exists(owner):
            return web.json_response(
                {"type": "NotFound", "title": f"ingress {owner} does not exist", "data": {}}, status=404
            )
        return _render(request, engine.checkers(owner), f"health checkers of {owner}", headers())

    return [
        web.get("/v1/healthcheck", all_checkers),
        web.get("/v1/healthcheck/{authority}/{id}/{resource}", one),
    ]
