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
from exporter.render.ca_files import CaFiles
from exporter.render.edge import EdgePolicy, TimeoutDefaults
from exporter.render.renderer import BUILTIN_TEMPLATES, Renderer
from tests.model_paths import field_paths, set_paths
from tests.strategies import CA_FILE, dangerous, http_ingress, ingress, label

# The strategies' upstream CA file is in a directory the renderers allow.
CA_DIRS = CaFiles([CA_FILE.parent])
RENDERER = Renderer(KeyLayout(), ["web"], edge=EdgePolicy(ca_files=CA_DIRS))
FAST_WITH_DEFAULTS = Renderer(
    KeyLayout(), ["web"], edge=EdgePolicy(TimeoutDefaults(dial=5, response_header=90.5, idle=None), ca_files=CA_DIRS)
)


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


# Generation speed is the machine's, not the code's: a busy 2-core runner trips the too_slow check.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
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


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
WITH_DEFAULTS = EdgePolicy(TimeoutDefaults(dial=5, response_header=90.5, idle=None), ca_files=CA_DIRS)


@pytest.fixture(scope="module")
def jinja_renderers(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Renderer]:
    """The built-in templates taken through the Jinja2 path (an override that is a copy of them), without and with default timeouts."""
    copies = tmp_path_factory.mktemp("builtin-copies")
    for name in ("http.json.j2", "tcp.json.j2"):
        (copies / name).write_text((BUILTIN_TEMPLATES / name).read_text())
    plain = EdgePolicy(ca_files=CA_DIRS)
    return {False: Renderer(KeyLayout(), ["web"], copies, plain), True: Renderer(KeyLayout(), ["web"], copies, WITH_DEFAULTS)}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ingress(), st.data())
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


def test_the_strategies_draw_every_field_of_the_ingress_model() -> None:
    """A field the strategies never draw is a field no property test ever renders: each one appears in some draw."""
    drawn: set[str] = set()

    @settings(max_examples=600, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(ingress())
    def draw(body: dict[str, Any]) -> None:
        drawn.update(set_paths(Ingress.model_validate(body)))

    draw()
    assert sorted(set(field_paths(Ingress)) - drawn) == []
