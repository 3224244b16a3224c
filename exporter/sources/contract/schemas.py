"""The component schemas of the push API, generated from the request models.

pydantic gives each model's fields, bounds and patterns (`Published` in ingress/values.py). What
depends on the protocol is said here by splitting the ingress into `HttpIngress` and `TcpIngress`,
each with its own upstreams; the cross-field rules JSON Schema can say become `if`/`then`,
`oneOf` or `not`, and the rest are named in the descriptions (`RULES` lists them).
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic.json_schema import models_json_schema

from ...ingress import RemoveRequest, UpsertRequest
from ...ingress.edge import REGEX_ACCEPTED
from ...ingress.values import server_url

Schema = dict[str, Any]
_REF = "#/components/schemas/"
# The fields of an http ingress that a tcp one may only leave out (or set to null).
_HTTP_ONLY = (
    "upstream_tls", "tls", "middlewares", "allowed_client_ips_strategy",
    "timeouts", "keepalive", "profile", "paths", "blocked_segments", "limits", "retry",
)

# Rules the schema cannot carry, each named in the description of the field it bounds.
RULES = {
    "unique server urls": "server urls must be unique",
    "unique instance names": "instance names must be unique",
    "unique ingresses": "appears more than once",
    "regex compiles": "regex",
    "authority bytes": "must be at most 253 bytes",
    "host name length": "must be at most 253 characters",
    "https for upstream_tls": "no server is https://",
    "timeouts bounds": "is outside upstream.timeouts_bounds",
    "ca_file dirs": "upstream.ca_file_dirs",
    "plugin installed": "no checker plugin provides kind",
}


def ref(name: str) -> Schema:
    """A reference to a component schema."""
    return {"$ref": _REF + name}


# The bounds pydantic leaves under their own names where a validator wraps an optional integer.
_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def _clean(node: Any) -> Any:
    """pydantic's schema without what only clutters the document (titles, `default: null`), bounds in JSON Schema's words."""
    if isinstance(node, dict):
        bounds = {_BOUNDS[k]: node[k] for k in _BOUNDS if k in node}
        if bounds and "anyOf" in node:
            # A union of numbers bounded as a whole: each branch carries the bounds.
            node = {k: v for k, v in node.items() if k not in _BOUNDS}
            node["anyOf"] = [{**branch, **bounds} for branch in node["anyOf"]]
        return {
            _BOUNDS.get(k, k): _clean(v) for k, v in node.items()
            if not (k == "title" and isinstance(v, str)) and not (k == "default" and v is None)
        }
    if isinstance(node, list):
        return [_clean(v) for v in node]
    return node


def _retarget(node: Any, names: dict[str, str]) -> Any:
    """`node` with its references to the schemas of `names` pointed at their replacements."""
    if isinstance(node, dict):
        if node.get("$ref", "").removeprefix(_REF) in names:
            return {**node, "$ref": _REF + names[node["$ref"].removeprefix(_REF)]}
        return {k: _retarget(v, names) for k, v in node.items()}
    if isinstance(node, list):
        return [_retarget(v, names) for v in node]
    return node


def _present(name: str) -> Schema:
    """"`name` is given and not null"."""
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


def model_schemas() -> dict[str, Schema]:
    """Every request model's schema, by model name, with the rules within one model added."""
    _, top = models_json_schema([(UpsertRequest, "validation"), (RemoveRequest, "validation")], ref_template=_REF + "{model}")
    defs: dict[str, Schema] = _clean(top["$defs"])
    defs["Ingress"]["properties"]["hosts"]["uniqueItems"] = True
    defs["PathRule"]["oneOf"] = [_present(n) for n in ("prefix", "exact", "regex")]
    defs["PathRule"]["properties"]["methods"]["anyOf"][0]["uniqueItems"] = True
    defs["IpStrategy"]["if"] = {"required": ["depth"], "properties": {"depth": {"minimum": 1}}}
    defs["IpStrategy"]["then"] = {"properties": {"excluded_ips": {"maxItems": 0}}}
    defs["UpstreamTls"]["not"] = {"allOf": [_present("ca_pem"), _present("ca_file")]}
    defs["RouterTls"]["if"] = {"required": ["domains"], "properties": {"domains": {"minItems": 1}}}
    defs["RouterTls"]["then"] = _present("cert_resolver")
    return defs


def protocol_schemas(defs: dict[str, Schema]) -> dict[str, Schema]:
    """The schemas by protocol: `Ingress` is one of `HttpIngress` and `TcpIngress`; `StoredIngress` is what GET lists."""
    fields = defs.pop("Ingress")
    out = dict(defs)
    out["HttpServer"] = _with_url(defs["Server"], ("http", "https"))
    out["TcpServer"] = _with_url(defs["Server"], ("tcp",))
    out["TcpServer"]["properties"]["weight"] = {"const": 1, "default": 1, "description": "Traefik cannot weight tcp servers; use canary"}
    http = {"Server": "HttpServer"}
    for name in ("ServersUpstream", "PluginUpstream"):
        out[name] = _retarget(defs[name], http)
    out["TcpServersUpstream"] = _retarget(defs["ServersUpstream"], {"Server": "TcpServer"})
    upstreams = ["ServersUpstream", "AiProxyMultiUpstream", "PluginUpstream"]
    out["HttpUpstream"] = {"oneOf": [ref(n) for n in upstreams], "description": "one upstream kind: `kind` tells which (default servers)"}
    out["HttpCanary"] = _with_upstream(defs["Canary"], ref("HttpUpstream"))
    out["TcpCanary"] = _with_upstream(defs["Canary"], ref("TcpServersUpstream"))
    out["HttpIngress"] = _http_ingress(fields)
    out["TcpIngress"] = _tcp_ingress(fields, defs["HealthCheck"])
    out["Ingress"] = {"oneOf": [ref("HttpIngress"), ref("TcpIngress")], "description": fields.get("description", "")}
    out["StoredIngress"] = _stored(fields)
    out["StoredPathRule"] = copy.deepcopy(defs["PathRule"])
    out["StoredPathRule"]["properties"]["regex"]["anyOf"][0]["pattern"] = REGEX_ACCEPTED
    del out["Server"]
    return out


def _with_url(server: Schema, schemes: tuple[str, ...]) -> Schema:
    out = copy.deepcopy(server)
    out["properties"]["url"]["pattern"] = server_url(schemes)
    return out


def _with_upstream(canary: Schema, upstream: Schema) -> Schema:
    out = copy.deepcopy(canary)
    out["properties"]["upstream"] = upstream
    return out


def _http_ingress(fields: Schema) -> Schema:
    out = copy.deepcopy(fields)
    props = out["properties"]
    props["protocol"] = {"const": "http", "default": "http"}
    props["hosts"]["minItems"] = 1
    props["upstream"] = ref("HttpUpstream")
    props["canary"] = {"anyOf": [ref("HttpCanary"), {"type": "null"}]}
    out["required"] = [*out["required"], "hosts"]
    out["allOf"] = [
        {"if": _present("allowed_client_ips_strategy"), "then": _present("allowed_client_ips")},
        {"if": {"anyOf": [_present("paths"), _present("profile")]}, "then": {"properties": {"path_prefix": {"const": "/"}}}},
        {"if": _present("upstream_tls"), "then": _https_somewhere()},
    ]
    props["upstream_tls"]["description"] = "TLS towards the upstream: needs at least one https:// server (upstream or canary)"
    return out


def _https_somewhere() -> Schema:
    """"At least one server of the upstream or of the canary is https://"."""
    https = {"contains": {"type": "object", "required": ["url"], "properties": {"url": {"pattern": "^https://"}}}}
    members = {"anyOf": [{"type": "object", "required": [name], "properties": {name: https}} for name in ("servers", "instances")]}
    canary = {"type": "object", "required": ["upstream"], "properties": {"upstream": members}}
    return {"anyOf": [
        {"required": ["upstream"], "properties": {"upstream": members}},
        {"required": ["canary"], "properties": {"canary": canary}},
    ]}


def _tcp_ingress(fields: Schema, check: Schema) -> Schema:
    out = copy.deepcopy(fields)
    props = out["properties"]
    props["protocol"] = {"const": "tcp"}
    props["path_prefix"] = {"const": "/", "default": "/", "description": "a tcp ingress cannot route by path"}
    props["upstream"] = ref("TcpServersUpstream")
    props["canary"] = {"anyOf": [ref("TcpCanary"), {"type": "null"}]}
    tcp_check = copy.deepcopy(check)
    for name in ("path", "expected_status_code", "expected-status-code"):
        default = check["properties"].get(name, {}).get("default", 200)
        tcp_check["properties"][name] = {"const": default, "description": "a tcp server is checked by a TCP connect"}
    props["health_check"] = tcp_check
    for name in _HTTP_ONLY:
        props[name] = {"type": "null", "description": "not supported for tcp ingresses"}
    out["required"] = [*out["required"], "protocol"]
    return out


def _stored(fields: Schema) -> Schema:
    out = copy.deepcopy(fields)
    out["description"] = "a stored ingress, with what is known of its commit and of Traefik serving it"
    # As stored, an ingress may hold what new input may no longer combine (docs/ingress.md): only its shape by protocol.
    out["properties"]["upstream"] = {"anyOf": [ref("HttpUpstream"), ref("TcpServersUpstream")]}
    out["properties"]["canary"] = {"anyOf": [ref("HttpCanary"), ref("TcpCanary"), {"type": "null"}]}
    out["properties"]["paths"]["anyOf"][0]["items"] = ref("StoredPathRule")
    out["properties"]["status"] = ref("IngressStatus")
    return out
