"""The built-in templates (`templates/http.json.j2`, `templates/tcp.json.j2`) as plain Python.

Rendering is the hot path of a bulk sync: the sandboxed Jinja2 template, parsing its JSON and
validating it against the Traefik schema cost most of the CPU per ingress. For the built-in
templates the same Traefik configuration is built here directly from the validated ingress
(whose rules guarantee every value the schema would check). A property test proves both
paths write identical keys for every generated ingress (tests/unit/test_properties.py); a template
overridden in `templates.dir` always takes the Jinja2 path with full validation.
"""

from __future__ import annotations

from typing import Any

from .context import Group, RenderContext


def fragment(context: RenderContext) -> dict[str, Any]:
    """What the built-in template of the ingress's protocol renders to, after validation and `exclude_none`."""
    ingress = context["ingress"]
    if ingress["protocol"] == "tcp":
        return {"tcp": _tcp(context)}
    return {"http": _http(context)}


def _canary_split(name: str, primary: Group, canary: Group) -> dict[str, Any]:
    return {"weighted": {"services": [
        {"name": f"{name}_primary", "weight": primary["weight"]},
        {"name": f"{name}_canary", "weight": canary["weight"]},
    ]}}


def _http(context: RenderContext) -> dict[str, Any]:
    name = context["name"]
    router: dict[str, Any] = {
        "rule": context["rule"], "service": name, "entryPoints": list(context["entrypoints"]),
        "priority": context["priority"],
    }
    if context["middlewares"]:
        router["middlewares"] = list(context["middlewares"])
    if context["router_tls"]:
        router["tls"] = context["router_tls"]
    services: dict[str, Any] = {}
    if (canary := context["canary"]) is not None:
        services[name] = _canary_split(name, context["primary"], canary)
    transport = context["transport_name"]
    for group in context["groups"]:
        services.update(_http_group(group, transport))
    return {"routers": {name: router}, "services": services}


def _http_group(group: Group, transport: str | None) -> dict[str, Any]:
    service = group["service"]
    if group["kind"] == "servers":
        lb: dict[str, Any] = {"servers": [dict(s) for s in group["lb_servers"]]}
        if not group["lb_servers"]:
            # Traefik's default, written only where it is the load balancer's one key: a service
            # without keys does not exist, and a router naming it answers 404 instead of 503.
            lb["passHostHeader"] = True
        if transport:
            lb["serversTransport"] = transport
        return {service: {"loadBalancer": lb}}
    if not group["instances"]:
        # every instance ejected: an empty load balancer answers 503
        return {service: {"loadBalancer": {"servers": [], "passHostHeader": False}}}
    out: dict[str, Any] = {service: {"weighted": {"services": [
        {"name": f"{service}_i_{i['name']}", "weight": i["weight"]} for i in group["instances"]
    ]}}}
    for i in group["instances"]:
        lb = {"servers": [{"url": i["url"]}], "passHostHeader": False}
        if transport:
            lb["serversTransport"] = transport
        out[f"{service}_i_{i['name']}"] = {"loadBalancer": lb}
    return out


def _tcp(context: RenderContext) -> dict[str, Any]:
    name, ingress = context["name"], context["ingress"]
    router: dict[str, Any] = {"rule": context["rule"], "service": name, "entryPoints": list(context["entrypoints"])}
    if ingress["hosts"]:
        router["tls"] = {"passthrough": True}
    services: dict[str, Any] = {}
    if (canary := context["canary"]) is not None:
        services[name] = _canary_split(name, context["primary"], canary)
    for group in context["groups"]:
        services[group["service"]] = {"loadBalancer": {"servers": [dict(s) for s in group["tcp_servers"]]}}
    return {"routers": {name: router}, "services": services}
