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
from exporter.render.renderer import Renderer
from tests.strategies import dangerous, http_ingress, label

RENDERER = Renderer(KeyLayout(), ["web"])


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
        body["hosts"] = [inject(body["hosts"][0])] + body["hosts"][1:]
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
