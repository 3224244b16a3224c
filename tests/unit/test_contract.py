"""The published contract (docs/openapi.yaml) is generated from the request models and agrees with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from jsonschema import Draft202012Validator, FormatChecker

from exporter.config import Settings
from exporter.ingress import Ingress
from exporter.sources.contract import openapi_spec, openapi_yaml
from tests.strategies import ingress

REPO = Path(__file__).resolve().parents[2]
_SPEC = openapi_spec()


def _validator(spec: dict[str, Any], name: str) -> Draft202012Validator:
    schema = {"$ref": f"#/components/schemas/{name}", "components": spec["components"]}
    return Draft202012Validator(schema, format_checker=FormatChecker())


def test_docs_openapi_yaml_is_the_generated_document() -> None:
    doc = REPO / "docs" / "openapi.yaml"
    assert doc.read_text() == openapi_yaml(), "run: traefik-etcd-exporter openapi > docs/openapi.yaml"


def test_the_document_is_valid_openapi_json_schema() -> None:
    Draft202012Validator.check_schema({"$defs": _SPEC["components"]["schemas"]})
    assert {op["operationId"] for item in _SPEC["paths"].values() for op in item.values()} == {
        "upsertIngresses", "removeIngresses", "listIngresses",
    }


@settings(max_examples=200, deadline=None)
@given(ingress())
def test_every_ingress_the_model_accepts_the_schema_accepts(data: dict[str, Any]) -> None:
    Ingress.model_validate(data)
    errors = [e.message for e in _validator(_SPEC, "Ingress").iter_errors(data)]
    assert not errors, errors


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"id": "123"}, "all digits"),
        ({"hosts": []}, "an http ingress needs a host"),
        ({"hosts": ["a.test", "a.test"]}, "unique hosts"),
        ({"upstream": {"servers": [{"url": "tcp://10.0.0.1:80"}]}}, "http needs http(s) servers"),
        ({"upstream": {"servers": [{"url": "http://10.0.0.1:080"}]}}, "a port without a leading zero"),
        ({"upstream": {"servers": [{"url": "http://Upper.test:80"}]}}, "a lowercase host"),
        ({"protocol": "tcp", "upstream": {"servers": [{"url": "tcp://10.0.0.1:80", "weight": 2}]}}, "tcp weights"),
        ({"protocol": "tcp", "upstream": {"servers": [{"url": "tcp://10.0.0.1:80"}]}, "keepalive": False}, "tcp has no edge"),
        ({"health_check": {"max_retries": 1, "max-retries": 2}}, "one spelling of a health field"),
        ({"paths": [{"prefix": "/a", "exact": "/b"}]}, "one of prefix, exact, regex"),
        ({"paths": [{"prefix": "/a"}], "path_prefix": "/x"}, "paths replace path_prefix"),
        ({"allowed_client_ips_strategy": {"depth": 1}}, "a strategy needs allowed_client_ips"),
        ({"allowed_client_ips": ["10.0.0.0/8"], "allowed_client_ips_strategy": {"depth": 1, "excluded_ips": ["10.0.0.1"]}}, "depth xor"),
        ({"tls": {"domains": [{"main": "a.test"}]}}, "domains need a cert_resolver"),
        ({"allowed_client_ips": ["10.0.0.256"]}, "an IP address"),
        ({"revision": 1.5}, "an integer revision"),
        ({"upstream_tls": {"insecure_skip_verify": True}}, "upstream_tls needs an https server"),
        ({"upstream_tls": {"insecure_skip_verify": True}, "canary": {"weight": 10, "upstream": {"servers": [{"url": "http://10.0.0.2:80"}]}}},
         "nor does the canary's http server count"),
    ],
)
def test_what_the_model_refuses_the_schema_refuses(change: dict[str, Any], rule: str) -> None:
    data = {"authority": "a", "id": "x", "revision": 1, "hosts": ["x.test"], "upstream": {"servers": [{"url": "http://10.0.0.1:80"}]}}
    data.update(change)
    with pytest.raises(ValueError):
        Ingress.model_validate(data)
    assert not _validator(_SPEC, "Ingress").is_valid(data), rule


def test_a_sidecars_own_document_carries_its_settings() -> None:
    own = Settings.model_validate({"upstream": {"timeouts_bounds": {"min": 1, "max": 60}}})
    spec = openapi_spec(own, ["model-server"])
    schemas = spec["components"]["schemas"]
    assert _validator(spec, "Timeouts").is_valid({"dial": 60}) and not _validator(spec, "Timeouts").is_valid({"dial": 61})
    assert schemas["PluginUpstream"]["properties"]["kind"]["enum"] == ["model-server"]
    assert not _validator(spec, "UpstreamTls").is_valid({"ca_file": "/run/secrets/ca.pem"}), "no ca_file_dirs: ca_file refused"
    parameters = [p for item in spec["paths"].values() for op in item.values() for p in op.get("parameters", [])]
    assert {"$ref": "#/components/parameters/Wait"} not in parameters, "no wait=served without traefik.api_url"
    assert "PluginUpstream" not in openapi_spec(own, [])["components"]["schemas"]


def test_the_generated_yaml_loads_back_to_the_document() -> None:
    assert yaml.safe_load(openapi_yaml()) == _SPEC
