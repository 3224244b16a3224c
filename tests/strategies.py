"""Hypothesis strategies for valid ingresses (and for strings that must be refused).

`ingress()` draws every field of the ingress model, for each protocol and upstream kind
(tests/unit/test_properties.py shows it does).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.helpers import REPO

label = st.from_regex(r"\A[a-z]([a-z0-9-]{0,12}[a-z0-9])?\Z")
host = st.lists(label, min_size=2, max_size=4).map(".".join)
path = st.from_regex(r"\A/[A-Za-z0-9._~%+=:@/-]{0,24}\Z")
ipv4 = st.tuples(*[st.integers(1, 254)] * 4).map(lambda t: ".".join(map(str, t)))
port = st.integers(1, 65535)
server = st.builds(lambda ip, p, w: {"url": f"http://{ip}:{p}", "weight": w}, ipv4, port, st.integers(0, 100))
servers_upstream = st.lists(server, min_size=1, max_size=12, unique_by=lambda s: s["url"]).map(
    lambda s: {"kind": "servers", "servers": s}
)
checks = st.fixed_dictionaries({}, optional={
    "path": path, "headers": st.dictionaries(st.sampled_from(["X-Probe", "Authorization"]), st.sampled_from(["1", "Bearer t"]), max_size=2),
    "interval": st.integers(1, 60), "max_retries": st.integers(1, 10), "max_wait_time": st.integers(1, 30),
    "expected_status_code": st.sampled_from([200, 204, 299]),
})
instance = st.builds(
    lambda n, ip, p, w, c: {"name": n, "url": f"http://{ip}:{p}", "weight": w, **({"checks": c} if c is not None else {})},
    label, ipv4, port, st.integers(0, 100), st.none() | checks,
)
ai_upstream = st.lists(instance, min_size=1, max_size=4, unique_by=lambda i: i["name"]).map(
    lambda i: {"kind": "ai-proxy-multi", "instances": i}
)
# A kind a checker plugin provides: rendered as servers; its plugin is checked when a push is admitted.
plugin_upstream = st.builds(
    lambda kind, s, config: {"kind": kind, "servers": s, "config": config},
    st.sampled_from(["vllm-ready", "tcp-connect"]), st.lists(server, min_size=1, max_size=4, unique_by=lambda s: s["url"]),
    st.dictionaries(st.sampled_from(["model", "port", "ratio", "strict"]), st.one_of(label, st.integers(1, 9), st.just(0.5), st.booleans()),
                    max_size=3),
)
cidr = st.builds(lambda ip, bits: f"{ip}/{bits}", ipv4, st.integers(8, 32))
entrypoints = st.lists(st.sampled_from(["web", "websecure", "internal"]), min_size=1, max_size=2, unique=True)
# A CA the renderer reads from a file (under the `ca_file_dirs` a test's renderer allows) or takes inline.
CA_FILE = REPO / "tests" / "unit" / "render" / "upstream-ca.pem"
CA_PEM = CA_FILE.read_text()


def health_check(protocol: str) -> st.SearchStrategy[dict[str, Any]]:
    """An active health check; a tcp one is a TCP connect, so it has no path or status to give."""
    optional: dict[str, st.SearchStrategy[Any]] = {
        "interval": st.integers(1, 60), "max_retries": st.integers(0, 10), "max_wait_time": st.integers(1, 30),
        "initial_delay": st.integers(0, 120),
    }
    if protocol == "http":
        optional |= {"path": path, "expected_status_code": st.sampled_from([200, 204, 301])}
    return st.fixed_dictionaries({"enable": st.booleans()}, optional=optional)


def https_first(upstream: dict[str, Any]) -> None:
    """Make the group's first member https:// (TLS towards the upstream needs one to apply to)."""
    first = upstream["instances" if upstream["kind"] == "ai-proxy-multi" else "servers"][0]
    first["url"] = first["url"].replace("http://", "https://", 1)


def sidecar_fields(protocol: str) -> st.SearchStrategy[dict[str, Any]]:
    """Fields whose acceptance depends on the sidecar's configuration: entrypoints, an active check."""
    return st.fixed_dictionaries({}, optional={"entrypoints": entrypoints, "health_check": health_check(protocol)})


@st.composite
def http_ingress(draw: Any, authority: str = "test") -> dict[str, Any]:
    """An http ingress any sidecar accepts as it is configured by default: built-in upstream kinds, the
    default entrypoints, no active check, an inline CA (`ingress()` adds what depends on the sidecar)."""
    body: dict[str, Any] = {
        "authority": authority,
        "id": draw(label.filter(lambda s: not s.isdigit())),
        "revision": draw(st.integers(0, 2**40)),
        "hosts": draw(st.lists(host, min_size=1, max_size=4, unique=True)),
        "path_prefix": draw(path),
        "upstream": draw(st.one_of(servers_upstream, ai_upstream)),
    }
    if draw(st.booleans()):
        body["canary"] = {"weight": draw(st.integers(1, 99)), "upstream": draw(st.one_of(servers_upstream, ai_upstream))}
    if draw(st.booleans()):
        body["allowed_client_ips"] = draw(st.lists(cidr, min_size=1, max_size=5))
    if draw(st.booleans()):
        body["upstream_tls"] = {"server_name": draw(host), "insecure_skip_verify": draw(st.booleans())}
        if draw(st.booleans()):
            body["upstream_tls"]["ca_pem"] = CA_PEM
        https_first(body["upstream"])
    return body


seconds = st.one_of(st.integers(1, 600), st.floats(0.1, 600, allow_nan=False).map(lambda s: round(s, 3)))
path_rule = st.one_of(
    st.builds(lambda p, m: {"prefix": p, **({"methods": m} if m else {})}, path,
              st.lists(st.sampled_from(["GET", "POST", "HEAD"]), unique=True)),
    st.builds(lambda p: {"exact": p}, path),
    st.sampled_from([{"regex": "^/v1/models(/[^/]+)?$"}, {"regex": "^/v2/[a-z]+/infer$", "methods": ["POST"]}]),
)


@st.composite
def edge_fields(draw: Any) -> dict[str, Any]:
    """Some of the model-serving edge fields of an http ingress (docs/ingress.md)."""
    body: dict[str, Any] = {}
    if draw(st.booleans()):
        body["timeouts"] = draw(st.fixed_dictionaries({}, optional={"dial": seconds, "response_header": seconds, "idle": seconds}))
    if draw(st.booleans()):
        body["keepalive"] = draw(st.booleans())
    if draw(st.booleans()):
        body["profile"] = draw(st.sampled_from(["openai", "sglang", "kserve-v2"]))
    if draw(st.booleans()):
        body["paths"] = draw(st.lists(path_rule, min_size=1, max_size=3))
    if draw(st.booleans()):
        body["blocked_segments"] = draw(st.lists(st.sampled_from(["metrics", "Admin", "openapi.json", "x-y"]), min_size=1, max_size=3))
    if draw(st.booleans()):
        rate = st.fixed_dictionaries({"average": st.integers(1, 100)}, optional={"burst": st.integers(1, 100), "period": seconds})
        body["limits"] = draw(st.fixed_dictionaries(
            {}, optional={"max_body_bytes": st.integers(1, 2**30), "max_in_flight": st.integers(1, 100), "rate": rate}))
    if draw(st.booleans()):
        backoff = st.sampled_from([0, 0.05, 1, 2.5])
        body["retry"] = draw(st.fixed_dictionaries({"attempts": st.integers(1, 5)}, optional={"initial_interval": backoff}))
    return body


# A router's `tls` section: domains only with a resolver (nothing else reads them).
router_tls = st.builds(
    lambda r, m, sans, o: {"cert_resolver": r, "domains": [{"main": m, "sans": sans}] if r else [], **({"options": o} if o else {})},
    st.sampled_from(["le", None]), host, st.lists(host, max_size=2), st.sampled_from([None, "modern@file", "default"]),
)


@st.composite
def ingress(draw: Any) -> dict[str, Any]:
    """Any valid ingress: http or tcp, every field drawn somewhere."""
    body: dict[str, Any]
    if draw(st.booleans()):
        body = draw(http_ingress(authority=draw(st.sampled_from(["test", "Worker_1", "edge-2"]))))
        body.update(draw(sidecar_fields("http")))
        if draw(st.booleans()):
            body["upstream"] = draw(plugin_upstream)
            if body.get("upstream_tls"):
                https_first(body["upstream"])
        if body.get("canary") and draw(st.booleans()):
            body["canary"]["upstream"] = draw(plugin_upstream)
        if body.get("upstream_tls") and "ca_pem" not in body["upstream_tls"] and draw(st.booleans()):
            body["upstream_tls"]["ca_file"] = str(CA_FILE)
        if draw(st.booleans()):
            body["tls"] = draw(st.one_of(st.just(True), st.just(False), router_tls))
        if draw(st.booleans()):
            body["middlewares"] = draw(st.lists(st.sampled_from(["cors@file", "auth@file", "x-y@kubernetes"]), min_size=1, max_size=3,
                                                unique=True))
        if body.get("allowed_client_ips") and draw(st.booleans()):
            # Traefik ignores excludedIPs when depth is set: the two are never given together.
            depth = draw(st.integers(0, 3))
            body["allowed_client_ips_strategy"] = {"depth": depth, "excluded_ips": [] if depth else draw(st.lists(cidr, max_size=2))}
        if draw(st.booleans()):
            for server in body["upstream"].get("servers", []):  # fractional weights
                server["weight"] = draw(st.floats(0, 10, allow_nan=False).map(lambda w: round(w, 3)))
        body.update(draw(edge_fields()))
        if "paths" in body or "profile" in body:
            body["path_prefix"] = "/"
        if body.get("canary") and draw(st.booleans()):
            body["canary"]["min_ready"] = draw(st.one_of(st.just("all"), st.integers(1, 3)))
        return body
    servers = draw(st.lists(st.tuples(ipv4, port), min_size=1, max_size=4, unique=True))
    body = {"authority": "test", "id": draw(label.filter(lambda s: not s.isdigit())), "revision": 1, "protocol": "tcp",
            "hosts": draw(st.lists(host, max_size=2, unique=True)),
            "upstream": {"servers": [{"url": f"tcp://{ip}:{p}"} for ip, p in servers]}}
    if draw(st.booleans()):
        body["canary"] = {"weight": draw(st.integers(1, 99)), "upstream": {"servers": [{"url": f"tcp://{servers[0][0]}:1"}]}}
    if draw(st.booleans()):
        body["allowed_client_ips"] = draw(st.lists(cidr, min_size=1, max_size=3))
    body.update(draw(sidecar_fields("tcp")))
    return body


# Characters that could break out of a rule, a key segment or a list element.
dangerous = st.sampled_from(["`", '"', "'", "(", ")", "|", ",", "/", " ", "\n", "@", "\\", "{", "}"])
