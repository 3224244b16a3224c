"""Hypothesis strategies for valid ingresses (and for strings that must be refused)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

label = st.from_regex(r"\A[a-z]([a-z0-9-]{0,12}[a-z0-9])?\Z")
host = st.lists(label, min_size=2, max_size=4).map(".".join)
path = st.from_regex(r"\A/[A-Za-z0-9._~%+=:@/-]{0,24}\Z")
ipv4 = st.tuples(*[st.integers(1, 254)] * 4).map(lambda t: ".".join(map(str, t)))
port = st.integers(1, 65535)
server = st.builds(lambda ip, p, w: {"url": f"http://{ip}:{p}", "weight": w}, ipv4, port, st.integers(0, 100))
servers_upstream = st.lists(server, min_size=1, max_size=12, unique_by=lambda s: s["url"]).map(
    lambda s: {"kind": "servers", "servers": s}
)
instance = st.builds(lambda n, ip, p: {"name": n, "url": f"http://{ip}:{p}"}, label, ipv4, port)
ai_upstream = st.lists(instance, min_size=1, max_size=4, unique_by=lambda i: i["name"]).map(
    lambda i: {"kind": "ai-proxy-multi", "instances": i}
)
cidr = st.builds(lambda ip, bits: f"{ip}/{bits}", ipv4, st.integers(8, 32))


@st.composite
def http_ingress(draw: Any, authority: str = "test") -> dict[str, Any]:
    body: dict[str, Any] = {
        "authority": authority,
        "id": draw(label.filter(lambda s: not s.isdigit())),
        "revision": draw(st.integers(0, 2**40)),
        "hosts": draw(st.lists(host, min_size=1, max_size=4, unique=True)),
        "path_prefix": draw(path),
        "upstream": draw(st.one_of(servers_upstream, ai_upstream)),
    }
    if draw(st.booleans()):
        body["canary"] = {"weight": draw(st.integers(1, 99)), "upstream": draw(servers_upstream)}
    if draw(st.booleans()):
        body["allowed_client_ips"] = draw(st.lists(cidr, min_size=1, max_size=5))
    if draw(st.booleans()):
        body["upstream_tls"] = {"server_name": draw(host), "insecure_skip_verify": draw(st.booleans())}
        # TLS towards the upstream needs an https:// server to apply to.
        upstream = body["upstream"]
        first = upstream["servers" if upstream["kind"] == "servers" else "instances"][0]
        first["url"] = first["url"].replace("http://", "https://", 1)
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


# Characters that could break out of a rule, a key segment or a list element.
dangerous = st.sampled_from(["`", '"', "'", "(", ")", "|", ",", "/", " ", "\n", "@", "\\", "{", "}"])
