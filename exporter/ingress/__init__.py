"""The ingress model: one shape shared by the push API and ingress files.

`core` (the ingress itself), `upstreams` (upstream kinds and the canary split), `health`,
`tls`, `routing` (client IPs, the user's middlewares), `envelopes` (ingress files and the
push API's bodies), `values` (validated names, hosts, paths, URLs), `bounds` (every list's
upper bound) and `errors` (field errors as reported). What other packages use is exported here.
"""

from .bounds import MAX_HOSTS, MAX_INGRESSES_PER_REQUEST, MAX_SERVERS
from .core import Ingress
from .envelopes import IngressFile, RemoveItem, RemoveRequest, UpsertRequest
from .errors import field_errors
from .health import HealthCheck
from .routing import IpStrategy
from .tls import RouterTls, TlsDomain, UpstreamTls
from .upstreams import (
    AiProxyMultiUpstream,
    Canary,
    Instance,
    InstanceChecks,
    PluginUpstream,
    Server,
    ServersUpstream,
    Upstream,
    named_instances,
)
from .values import parse_upstream_url, validate_entrypoint

__all__ = [
    "MAX_HOSTS",
    "MAX_INGRESSES_PER_REQUEST",
    "MAX_SERVERS",
    "AiProxyMultiUpstream",
    "Canary",
    "HealthCheck",
    "Ingress",
    "IngressFile",
    "Instance",
    "InstanceChecks",
    "IpStrategy",
    "PluginUpstream",
    "RemoveItem",
    "RemoveRequest",
    "RouterTls",
    "Server",
    "ServersUpstream",
    "TlsDomain",
    "UpsertRequest",
    "Upstream",
    "UpstreamTls",
    "field_errors",
    "named_instances",
    "parse_upstream_url",
    "validate_entrypoint",
]
