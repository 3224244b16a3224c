"""Render one ingress into the keys it owns under its authority's root.

Templates (Jinja2, sandboxed, StrictUndefined) produce a fragment of Traefik dynamic
configuration as JSON (parsing YAML cost 5x more than the whole rest of a render); it is
validated against `traefik_schema`, its object names are checked to belong to the ingress,
and it is flattened. Recent results are kept by what they depend on (`key_of`); a planner that
found an ingress as written does not ask again (plan/planner.py).
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import ChoiceLoader, FileSystemLoader, StrictUndefined, Template
from jinja2 import TemplateError as JinjaError
from jinja2.sandbox import SandboxedEnvironment
from pydantic import ValidationError

from ..errors import TemplateError
from ..ingress import (
    AiProxyMultiUpstream,
    Canary,
    Ingress,
    PluginUpstream,
    RouterTls,
    ServersUpstream,
    field_errors,
    named_instances,
)
from ..keys import IngressRef, KeyLayout
from . import builtin
from .context import Group, LbServer, RenderContext, Server
from .edge import EdgePolicy
from .flatten import flatten
from .rules import http_rule, tcp_rule
from .shared import SharedObject, SharedObjects
from .traefik_schema import Fragment


def _builtin_templates() -> Path:
    # A source checkout (editable install) has templates/ beside the package; a wheel install
    # puts them under <prefix>/share/traefik-etcd-exporter/templates.
    checkout = Path(__file__).resolve().parent.parent.parent / "templates"
    return checkout if checkout.is_dir() else Path(sys.prefix) / "share" / "traefik-etcd-exporter" / "templates"


BUILTIN_TEMPLATES = _builtin_templates()
_NOTHING: frozenset[str] = frozenset()
# Renders kept: a request's worth (1,000 ingresses) and more. Not every ingress: a full pass
# renders only the ingresses whose keys changed (plan/planner.py), and 10,000 kept renders were
# 16 MB at every edge field on each.
_CACHE_SIZE = 2048
# What a render depends on: the ingress (its record's stored JSON), the servers left out, the
# version of its CA file and of the templates.
RenderKey = tuple[str, frozenset[str], int, int]


@dataclass(frozen=True, slots=True)
class RenderedIngress:
    """The keys one ingress owns: `objects` are the object paths (`http/routers/<name>`) under `root`;
    `shared` the shared objects (render/shared.py) its keys reference."""

    root: str
    objects: tuple[str, ...]
    kv: dict[str, str]
    shared: tuple[SharedObject, ...] = ()


def traefik_weights(weights: Sequence[int | float]) -> list[int]:
    """Traefik's integer weights: integers stay; a group with a fractional weight is scaled by 1000 (0.7 -> 700)."""
    if all(float(w).is_integer() for w in weights):
        return [int(w) for w in weights]
    return [round(w * 1000) for w in weights]


def _lb_servers(servers: list[Server]) -> list[LbServer]:
    out: list[LbServer] = []
    for server in servers:
        out.append({"url": server["url"]} if server["weight"] == 1 else {"url": server["url"], "weight": server["weight"]})
    return out


def _group(upstream: ServersUpstream | AiProxyMultiUpstream | PluginUpstream, ejected: frozenset[str]) -> Group:
    instances = named_instances(upstream)
    if instances is None:
        servers = [s for s in upstream.members() if s.url not in ejected]
        weights = traefik_weights([s.weight for s in servers])
        weighted: list[Server] = [{"url": s.url, "weight": w} for s, w in zip(servers, weights, strict=True)]
        return {
            "kind": "servers",  # plugin kinds render as a plain load balancer too
            "servers": weighted,
            # Ready-made Traefik server lists, so templates need no loop (rendering is the hot path);
            # a weight of 1 is Traefik's default and is not written.
            "lb_servers": _lb_servers(weighted),
            # tcp://host:port -> host:port (the URL was validated: no path or credentials)
            "tcp_servers": [{"address": s.url.partition("://")[2].rstrip("/")} for s in servers],
        }
    live = [i for i in instances if i.url not in ejected]
    weights = traefik_weights([i.weight for i in live])
    return {"kind": upstream.kind, "instances": [{"name": i.name, "url": i.url, "weight": w} for i, w in zip(live, weights, strict=True)]}


def _fast_fields(ingress: Ingress) -> dict[str, Any]:
    """The fields of `ingress` the built-in fast path reads, as `model_dump(mode="json")` has them."""
    return {"protocol": ingress.protocol, "hosts": ingress.hosts}


def _router_tls(tls: bool | RouterTls | None) -> bool | dict[str, Any] | None:
    """The router's `tls` section in Traefik's shape: True (default certificate), a section, or None."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return True
    section: dict[str, Any] = {}
    if tls.cert_resolver:
        section["certResolver"] = tls.cert_resolver
    if tls.options:
        section["options"] = tls.options
    if tls.domains:
        section["domains"] = [{"main": d.main, **({"sans": d.sans} if d.sans else {})} for d in tls.domains]
    return section or True


def _environment(template_dir: Path | None) -> SandboxedEnvironment:
    loaders = [FileSystemLoader(str(template_dir))] if template_dir else []
    loaders.append(FileSystemLoader(str(BUILTIN_TEMPLATES)))
    env = SandboxedEnvironment(
        loader=ChoiceLoader(loaders),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        auto_reload=False,  # no stat() per render; `reload()` starts afresh when templates change
    )
    env.globals.update(http_rule=http_rule, tcp_rule=tcp_rule)
    env.filters["json"] = json.dumps
    return env


def _routable(group: Group) -> bool:
    return bool(group.get("servers") or group.get("instances"))


def _ready(canary: Canary, group: Group) -> bool:
    """True while enough of the canary's servers are routable for it to get its weight (`min_ready`)."""
    routable = len(group.get("servers") or group.get("instances") or ())
    upstream = canary.upstream
    total = len(upstream.members())
    need = total if canary.min_ready == "all" else canary.min_ready or 1
    return routable >= need


def _split_weights(canary: Canary, primary: Group, group: Group) -> tuple[int, int]:
    """The primary's and canary's weights: a group with no routable server (a canary short of
    `min_ready`) gets 0 while the other has one.

    When both are down the configured split stays, and the service answers 503 (never 404).
    """
    canary_weight = canary.weight
    primary_up, canary_up = _routable(primary), _ready(canary, group)
    if primary_up and not canary_up:
        return 100 - canary_weight, 0
    if canary_up and not primary_up:
        return 0, canary_weight
    return 100 - canary_weight, canary_weight


class Renderer:
    """Turns ingresses into owned keys; one per process, shared by every caller."""

    def __init__(
        self, layout: KeyLayout, default_entrypoints: list[str], template_dir: Path | None = None, edge: EdgePolicy | None = None
    ) -> None:
        self._layout = layout
        self._edge = edge if edge is not None else EdgePolicy()
        self._template_dir = template_dir
        self._default_entrypoints = list(default_entrypoints)
        self._env = _environment(template_dir)
        self._templates: dict[str, Template] = {}
        self._cache: OrderedDict[RenderKey, RenderedIngress] = OrderedDict()
        self._builtin = self._builtin_protocols()
        self._generation = 0  # of the templates
        self.shared = SharedObjects()

    def _builtin_protocols(self) -> frozenset[str]:
        # Protocols whose template is not overridden in templates.dir take the Python fast path.
        d = self._template_dir
        return frozenset(p for p in ("http", "tcp") if d is None or not (d / f"{p}.json.j2").exists())

    def forget_renders(self) -> None:
        """Drop every cached render: the next render of each ingress is computed again."""
        self._cache.clear()

    def reload(self) -> None:
        """Read the templates again and forget every cached render (the templates changed)."""
        self._env = _environment(self._template_dir)
        self._templates = {}
        self.forget_renders()
        self._builtin = self._builtin_protocols()
        self._generation += 1

    def may_refuse(self, ingress: Ingress) -> bool:
        """True when rendering `ingress` can fail: its protocol's template comes from templates.dir.

        The built-in path builds keys straight from the validated ingress and never fails (a
        property test holds it to the built-in templates for every generated ingress), unless
        the ingress names a CA file that has no good content.
        """
        return ingress.protocol not in self._builtin or ingress.ca_file is not None

    def render(
        self, ingress: Ingress, ejected: frozenset[str] = frozenset(), cache_key: str | None = None, *, key: RenderKey | None = None
    ) -> RenderedIngress:
        """Render `ingress` without the servers/instances whose URLs are in `ejected`.

        `cache_key` is a text that names exactly this ingress when the caller has one (its record's
        stored JSON); without it the ingress's canonical JSON is computed. `key`: its `key_of`,
        when the caller has it already.
        Raises TemplateError (naming the template) when the output is not valid Traefik config.
        """
        key = key if key is not None else self.key_of(ingress, ejected, cache_key)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        rendered = self._render(ingress, ejected)
        self._cache[key] = rendered
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return rendered

    def forget(self, key: RenderKey) -> None:
        """Drop one kept render: its keys are in etcd as rendered, the mirror holds them already."""
        self._cache.pop(key, None)

    def key_of(self, ingress: Ingress, ejected: frozenset[str] = frozenset(), cache_key: str | None = None) -> RenderKey:
        """What rendering `ingress` depends on now: two equal keys render to the same keys."""
        ca_file = ingress.ca_file
        ca_version = self._edge.ca_files.version(ca_file) if ca_file is not None else 0
        # One shared empty set in the keys: each call's own would be kept, 10,000 of them.
        return (cache_key if cache_key is not None else ingress.model_dump_json(), ejected or _NOTHING, ca_version, self._generation)

    def _render(self, ingress: Ingress, ejected: frozenset[str]) -> RenderedIngress:
        template_name = f"{ingress.protocol}.json.j2"
        name = self._layout.object_name(IngressRef(ingress.authority, ingress.id))
        primary = _group(ingress.upstream, ejected)
        canary = _group(ingress.canary.upstream, ejected) if ingress.canary else None
        if canary is None or ingress.canary is None:
            primary["service"] = name
            groups = [primary]
        else:
            primary["service"], canary["service"] = f"{name}_primary", f"{name}_canary"
            primary["weight"], canary["weight"] = _split_weights(ingress.canary, primary, canary)
            groups = [primary, canary]
        fast = ingress.protocol in self._builtin
        http = ingress.protocol == "http"
        root = self._layout.root(ingress.authority)
        shared = [self.shared.object(root, "middlewares", kind, d) for kind, d in self._edge.middlewares(ingress)] if http else []
        definition = self._edge.transport(ingress) if http else None
        transport = self.shared.object(root, "serversTransports", "transport", definition) if definition else None
        context: RenderContext = {
            # The fast path reads two fields; a whole JSON dump is for templates.
            "ingress": _fast_fields(ingress) if fast else ingress.model_dump(mode="json"),
            "middlewares": [*(o.path.rpartition("/")[2] for o in shared), *(ingress.middlewares or [])],
            "transport_name": transport.path.rpartition("/")[2] if transport else None,
            "priority": self._edge.priority(ingress),
            "router_tls": _router_tls(ingress.tls),
            "name": name,
            "rule": self._edge.rule(ingress) if http else tcp_rule(ingress.hosts, ingress.allowed_client_ips),
            "entrypoints": ingress.entrypoints or self._default_entrypoints,
            "primary": primary,
            "canary": canary,
            "groups": groups,
        }
        if fast:
            data = builtin.fragment(context)
        else:
            data = _validated(self._template_text(template_name, context, ingress), template_name, name, ingress)
        objects = [f"{proto}/{kind}/{obj}" for proto, section in data.items() for kind, objs in section.items() for obj in objs]
        if transport is not None:
            shared.append(transport)
        return RenderedIngress(root=root, objects=tuple(objects), kv=flatten(data, root), shared=tuple(shared))

    def _template_text(self, template_name: str, context: RenderContext, ingress: Ingress) -> str:
        try:
            template = self._templates.get(template_name)
            if template is None:
                template = self._templates[template_name] = self._env.get_template(template_name)
            return template.render(context)
        except JinjaError as exc:
            raise TemplateError(
                f"template {template_name} failed for {ingress.authority}/{ingress.id}: {exc}",
                {"template": template_name},
            ) from None


def _validated(text: str, template_name: str, name: str, ingress: Ingress) -> dict[str, Any]:
    """The rendered fragment checked against Traefik's schema, every object named `name` or `name_*`."""
    try:
        fragment = Fragment.model_validate_json(text)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise TemplateError(
                f"template {template_name} rendered invalid JSON for {ingress.authority}/{ingress.id}",
                {"template": template_name},
            ) from None
        raise TemplateError(
            f"template {template_name} rendered invalid Traefik config for {ingress.authority}/{ingress.id}",
            {"template": template_name, "errors": field_errors(exc)},
        ) from None
    data: dict[str, Any] = fragment.model_dump(exclude_none=True)
    for section in data.values():
        for kind, objs in section.items():
            for obj in objs:
                if obj != name and not obj.startswith(name + "_"):
                    raise TemplateError(
                        f"template {template_name} rendered object {kind}/{obj!r}, which is not named {name} or {name}_*",
                        {"template": template_name},
                    )
    return data

