"""The context every template renders from (built-in fast path and Jinja templates alike).

Typed dicts: a template reads them as plain dicts, and the type checker holds the renderer that
builds them and the fast path that reads them to one shape. docs/templates.md documents each key.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class Server(TypedDict):
    """A server of a load balancer, with its Traefik weight."""

    url: str
    weight: int


class LbServer(TypedDict):
    """A server as Traefik's load balancer takes it: a weight of 1 (Traefik's default) is left out."""

    url: str
    weight: NotRequired[int]


class TcpServer(TypedDict):
    """A tcp load balancer's server."""

    address: str


class Instance(TypedDict):
    """An `ai-proxy-multi` instance, with its Traefik weight."""

    name: str
    url: str
    weight: int


class Group(TypedDict):
    """An upstream group after health ejections; rendered as the service named `service`."""

    kind: str
    service: NotRequired[str]
    # With a canary: the group's share of traffic in the parent `weighted` service.
    weight: NotRequired[int]
    servers: NotRequired[list[Server]]
    lb_servers: NotRequired[list[LbServer]]
    tcp_servers: NotRequired[list[TcpServer]]
    instances: NotRequired[list[Instance]]


class RenderContext(TypedDict):
    """What one ingress renders from."""

    # The validated ingress as `model_dump(mode="json")` has it (the fast path gets only the fields it reads).
    ingress: dict[str, Any]
    # The router's middlewares: the shared edge ones (render/shared.py), then the ingress's own references.
    middlewares: list[str]
    # The shared servers transport the load balancers name (None: Traefik's default).
    transport_name: str | None
    priority: int
    router_tls: bool | dict[str, Any] | None
    name: str
    rule: str
    entrypoints: list[str]
    primary: Group
    canary: Group | None
    groups: list[Group]
