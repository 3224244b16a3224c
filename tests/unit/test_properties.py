"""Property-based: random valid ingresses render to valid Traefik keys; random invalid ones are refused."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from exporter.ingress import Ingress
from exporter.keys import KeyLayout
from exporter.render.edge import EdgePolicy, TimeoutDefaults
from exporter.render.renderer import BUILTIN_TEMPLATES, Renderer
from tests.strategies import cidr, dangerous, edge_fields, host, http_ingress, ipv4, label, port

RENDERER = Renderer(KeyLayout(), ["web"])
FAST_WITH_DEFAULTS = Renderer(KeyLayout(), ["web"], edge=EdgePolicy(TimeoutDefaults(dial=5, response_header=90.5, idle=None)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(http_ingress())
def test_every_valid_ingress_renders_to_safe_keys(body: dict[str, Any]) -> None:
    ingress = Ingress.model_validate(body)
    rendered = RENDERER.render(ingress)
    name = f"test_{ingress.id}"
    assert rendered.kv
    for key, value in rendered.kv.items():
        rel = key.removeprefix("traefik/worker_test/").split("/")
        assert rel[0] == "http"
        assert rel[2] == name or rel[2].startswith(name + "_")
        assert all(segment and segment == segment.strip() for segment in rel)
        if rel[-1].isdigit():
            assert "," not in value  # a simple list element
    rule = rendered.kv[f"traefik/worker_test/http/routers/{name}/rule"]
    assert rule.count("`") % 2 == 0 and "\n" not in rule


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(http_ingress(), st.sampled_from(["id", "host", "path"]), dangerous, st.integers(0, 5))
def test_a_dangerous_character_anywhere_is_refused(body: dict[str, Any], field: str, char: str, at: int) -> None:
    def inject(text: str) -> str:
        pos = min(at, len(text))
        return text[:pos] + char + text[pos:]

    if field == "id":
        body["id"] = inject(body["id"])
    elif field == "host":
        body["hosts"] = [inject(body["hosts"][0]), *body["hosts"][1:]]
    else:
        assume(char not in "@/")  # legal path characters
        body["path_prefix"] = inject(body["path_prefix"]) if at else body["path_prefix"] + char
    with pytest.raises(ValidationError):
        Ingress.model_validate(body)


@settings(max_examples=200, deadline=None)
@given(http_ingress(), st.text(min_size=1, max_size=80).filter(lambda a: "/" not in a and a.isprintable()))
def test_any_free_text_authority_stays_verbatim_in_keys_and_never_reaches_an_object_name(body: dict[str, Any], authority: str) -> None:
    body["authority"] = authority
    assume(len(authority.encode()) <= 253)
    rendered = RENDERER.render(Ingress.model_validate(body))
    assert rendered.root == f"traefik/worker_{authority}"
    layout = KeyLayout()
    label = layout.object_label(authority)
    assert re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", label) and not label.isdigit()
    for key in rendered.kv:
        name = key[len(rendered.root) + 1 :].split("/")[2]
        assert name.startswith(f"{label}_{body['id']}")
        assert layout.owner_of_object(f"x/http/routers/{name}") == (authority, body["id"])


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=70) | label | st.from_regex(r"\A[0-9]{1,5}\Z"))
def test_ids_are_accepted_exactly_when_they_are_lowercase_dns_labels_not_all_digits(value: str) -> None:
    body = {"authority": "a", "id": value, "revision": 1, "hosts": ["a.test"], "upstream": {"servers": [{"url": "http://10.0.0.1:80"}]}}
    valid = re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", value) is not None and not value.isdigit()
    if valid:
        assert Ingress.model_validate(body).id == value
    else:
        with pytest.raises(ValidationError):
            Ingress.model_validate(body)


# Configured default timeouts reach every http ingress's transport: both paths with them too.
WITH_DEFAULTS = EdgePolicy(TimeoutDefaults(dial=5, response_header=90.5, idle=None))


@pytest.fixture(scope="module")
def jinja_renderers(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Renderer]:
    """The built-in templates taken through the Jinja2 path (an override that is a copy of them), without and with default timeouts."""
    copies = tmp_path_factory.mktemp("builtin-copies")
    for name in ("http.json.j2", "tcp.json.j2"):
        (copies / name).write_text((BUILTIN_TEMPLATES / name).read_text())
    return {False: Renderer(KeyLayout(), ["web"], copies), True: Renderer(KeyLayout(), ["web"], copies, WITH_DEFAULTS)}


@st.composite
def any_ingress(draw: Any) -> dict[str, Any]:
    body: dict[str, Any]
    if draw(st.booleans()):
        body = draw(http_ingress(authority=draw(st.sampled_from(["test", "Worker_1", "edge-2"]))))
        if draw(st.booleans()):
            body["tls"] = draw(st.one_of(st.just(True), st.just(False), st.builds(
                lambda r, m: {"cert_resolver": r, "domains": [{"main": m, "sans": []}] if r else []}, st.sampled_from(["le", None]), host)))
        if draw(st.booleans()):
            body["middlewares"] = draw(st.lists(st.sampled_from(["cors@file", "auth@file", "x-y@kubernetes"]), min_size=1, max_size=3,
                                                unique=True))
        if body.get("allowed_client_ips") and draw(st.booleans()):
            # Traefik ignores excludedIPs when depth is set: the two are never given together.
            depth = draw(st.integers(0, 3))
            body["allowed_client_ips_strategy"] = {"depth": depth, "excluded_ips": [] if depth else draw(st.lists(cidr, max_size=2))}
        if draw(st.booleans()):
            for server in body["upstream"].get("servers", []):
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
    return body


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(any_ingress(), st.data())
def test_the_fast_path_writes_exactly_the_keys_of_the_builtin_templates(
    jinja_renderers: dict[bool, Renderer], body: dict[str, Any], data: st.DataObject
) -> None:
    ingress = Ingress.model_validate(body)
    urls = sorted({s.url for g in (ingress.upstream, ingress.canary.upstream if ingress.canary else None) if g is not None
                   for s in getattr(g, "servers", [])} | {i.url for i in getattr(ingress.upstream, "instances", [])})
    ejected = frozenset(data.draw(st.lists(st.sampled_from(urls), unique=True))) if urls else frozenset()
    defaults = data.draw(st.booleans())
    fast = (FAST_WITH_DEFAULTS if defaults else RENDERER).render(ingress, ejected)
    slow = jinja_renderers[defaults].render(ingress, ejected)
    assert fast.kv == slow.kv and sorted(fast.objects) == sorted(slow.objects) and fast.root == slow.root
