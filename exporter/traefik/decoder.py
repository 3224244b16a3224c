"""Traefik's KV decoder traps, applied to keys the exporter does not own: which of them freeze Traefik.

One key under a root that Traefik cannot decode makes its etcd provider refuse every later
update (it keeps serving the last good configuration). The exporter validates everything it
writes (render/traefik_schema.py); this module looks at everything else under a root and
names the keys that would be rejected, by the traps measured on Traefik 3.7 (docs/convergence.md):

- a value on `<root>/tls` itself;
- an object name made only of digits (decoded as a list index) or holding `@`;
- an unknown field directly under a router, service, middleware or servers transport (a
  misspelled `rulez`), or an unknown section (`http/routerz`);
- a value that is not a number or not a boolean where Traefik wants one (`priority=abc`).

Checks stop where a table below stops: a key deeper than they reach is never reported, so a
report is never a false alarm about a valid configuration.
"""

from __future__ import annotations

import re

# Sections Traefik decodes under each kind (lowercase: Traefik matches names case-insensitively).
_SECTIONS = {
    "http": {"routers", "services", "middlewares", "serverstransports", "models"},
    "tcp": {"routers", "services", "middlewares", "serverstransports", "models"},
    "udp": {"routers", "services"},
}
# Fields directly under an object of each section, from Traefik 3.7's dynamic configuration.
_FIELDS = {
    ("http", "routers"): {"entrypoints", "middlewares", "service", "rule", "parentrefs", "rulesyntax", "priority", "tls",
                          "observability"},
    ("http", "services"): {"loadbalancer", "highestrandomweight", "weighted", "mirroring", "failover", "middlewares"},
    ("http", "middlewares"): {
        "addprefix", "stripprefix", "stripprefixregex", "replacepath", "replacepathregex", "chain", "ipwhitelist",
        "ipallowlist", "headers", "encodedcharacters", "errors", "ratelimit", "redirectregex", "redirectscheme",
        "basicauth", "digestauth", "forwardauth", "inflightreq", "buffering", "circuitbreaker", "compress",
        "passtlsclientcert", "retry", "contenttype", "grpcweb", "plugin", "requestheadermodifier",
        "responseheadermodifier", "requestredirect", "urlrewrite",
    },
    ("http", "serverstransports"): {"servername", "insecureskipverify", "rootcas", "certificates", "ciphersuites",
                                    "minversion", "maxversion", "maxidleconnsperhost", "forwardingtimeouts",
                                    "peercerturi", "peercertsans", "spiffe", "disablehttp2"},
    ("tcp", "routers"): {"entrypoints", "middlewares", "service", "rule", "rulesyntax", "priority", "tls"},
    ("tcp", "services"): {"loadbalancer", "weighted"},
    ("tcp", "middlewares"): {"inflightconn", "ipwhitelist", "ipallowlist"},
    ("tcp", "serverstransports"): {"dialkeepalive", "dialtimeout", "proxyprotocol", "terminationdelay", "tls"},
    ("udp", "routers"): {"entrypoints", "service"},
    ("udp", "services"): {"loadbalancer", "weighted"},
}
# Fields of one load-balancer server (`<object>/loadBalancer/servers/<n>/<field>`); a tcp server
# has no weight (writing one froze Traefik 3.7 in this project's own tests).
_SERVER_FIELDS = {"http": {"url", "weight", "preservepath"}, "tcp": {"address", "tls"}, "udp": {"address"}}
# Leaf fields that hold a number or a boolean wherever they appear.
_INTEGERS = {"priority", "weight", "depth", "attempts", "average", "burst", "percent", "maxidleconnsperhost"}
_BOOLEANS = {"passhostheader", "insecureskipverify", "passthrough"}
_INTEGER_RE = re.compile(r"^-?\d+\Z")


def decoder_problem(root: str, key: str, value: str) -> str | None:
    """Why Traefik's decoder would reject `key` (a key under `root`), or None when none of the traps applies."""
    parts = key[len(root) + 1 :].split("/")
    kind = parts[0].lower()
    if kind == "tls" and len(parts) == 1:
        return "a value on the tls node itself"
    if kind not in _SECTIONS or len(parts) < 2:
        return None  # outside http/tcp/udp/tls Traefik ignores keys
    section = parts[1].lower()
    if section not in _SECTIONS[kind]:
        return f"unknown section {kind}/{parts[1]}"
    if len(parts) < 3:
        return None
    name = parts[2]
    if name.isdigit():
        return f"object name {name!r} is all digits (decoded as a list index)"
    if "@" in name:
        return f"object name {name!r} holds '@' (the provider separator)"
    fields = _FIELDS.get((kind, section))
    if len(parts) >= 4 and fields is not None and parts[3].lower() not in fields:
        return f"unknown field {parts[3]!r} of {kind}/{section}"
    lowered = [p.lower() for p in parts]
    if len(parts) == 7 and section == "services" and lowered[3:5] == ["loadbalancer", "servers"] and lowered[6] not in _SERVER_FIELDS[kind]:
        return f"unknown field {parts[6]!r} of a {kind} load-balancer server"
    return _leaf_problem(lowered[-1], value) if len(parts) >= 4 else None


def _leaf_problem(field: str, value: str) -> str | None:
    if field in _INTEGERS and not _INTEGER_RE.match(value.strip()):
        return f"{field} must be a number, not {value[:40]!r}"
    if field in _BOOLEANS and value.strip().lower() not in ("true", "false"):
        return f"{field} must be true or false, not {value[:40]!r}"
    return None
