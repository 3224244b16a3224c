"""Validation of every ingress field: good values pass, bad ones fail naming the field."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from exporter.ingress import (
    MAX_HOSTS,
    MAX_SERVERS,
    Ingress,
    IngressFile,
    RemoveRequest,
    ServersUpstream,
    field_errors,
    parse_upstream_url,
)
from exporter.store.records import decode_record

BASE: dict[str, Any] = {
    "authority": "edge",
    "id": "llama",
    "revision": 3,
    "hosts": ["llama.example.test"],
    "upstream": {"servers": [{"url": "http://10.0.0.5:8000"}]},
}


def build(**changes: Any) -> Ingress:
    data = {**BASE, **changes}
    return Ingress.model_validate(data)


def errors_of(**changes: Any) -> list[dict[str, str]]:
    with pytest.raises(ValidationError) as info:
        build(**changes)
    return field_errors(info.value)


def locs(**changes: Any) -> list[str]:
    return [e["loc"] for e in errors_of(**changes)]


def test_design_example_validates_with_backend_ai_defaults() -> None:
    ingress = build()
    assert ingress.protocol == "http"
    assert ingress.path_prefix == "/"
    assert ingress.upstream.kind == "servers"
    hc = ingress.health_check
    assert (hc.enable, hc.path, hc.interval, hc.max_retries, hc.max_wait_time, hc.expected_status_code, hc.initial_delay) == (
        False, "/health", 10.0, 10, 15.0, 200, 60.0,
    )


@pytest.mark.parametrize("value", ["", "a/b", "/", "tab\there", "new\nline", "del\x7f", "a" * 254, "é" * 127])
def test_authority_is_free_text_without_slash_or_control_characters_at_most_253_bytes(value: str) -> None:
    assert locs(authority=value) == ["authority"]


@pytest.mark.parametrize("value", ["Worker-1", "worker_1", "edge", "123", "ed ge", "é", "a" * 253, "-edge"])
def test_backendai_authorities_are_accepted(value: str) -> None:
    assert build(authority=value).authority == value


@pytest.mark.parametrize("value", ["llama/../x", "Llama", "llama@etcd", "007", "llama,2", "llama`", "ll\u0430ma"])
def test_id_rejects_key_segments_case_digits_and_provider_separator(value: str) -> None:
    assert locs(id=value) == ["id"]


@pytest.mark.parametrize("value", ["a", "a1", "model-7", "x" * 63])
def test_id_accepts_dns_labels(value: str) -> None:
    assert build(id=value).id == value


@pytest.mark.parametrize(
    "host",
    [
        "a`) || Host(`evil",
        "evil.test`)",
        "evil.test\")",
        "Evil.test",
        "evil..test",
        "evil.test,other.test",
        "ev(il).test",
        "-evil.test",
        "évil.test",
        "evil.test/path",
        "*.test",
        "a" * 64 + ".test",
    ],
)
def test_host_injection_and_bad_names_are_rejected(host: str) -> None:
    assert locs(hosts=[host]) == ["hosts.0"]


def test_wildcard_and_plain_hosts_are_accepted() -> None:
    assert build(hosts=["*.models.example.test", "llama.example.test"]).hosts[0] == "*.models.example.test"


def test_hosts_are_bounded_unique_and_required_for_http() -> None:
    assert locs(hosts=[f"h{n}.test" for n in range(MAX_HOSTS + 1)]) == ["hosts"]
    assert "hosts: must be unique" in errors_of(hosts=["a.test", "a.test"])[0]["msg"]
    assert "at least one host" in errors_of(hosts=[])[0]["msg"]


@pytest.mark.parametrize(
    "path", ["v1", "/v1`) || Path(`/", "/a b", "/a,b", "/a{1,3}", "/(x)", "/a'b", '/a"b', "/a|b", "/" + "a" * 300]
)
def test_path_prefix_injection_is_rejected(path: str) -> None:
    assert locs(path_prefix=path) == ["path_prefix"]


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5",
        "10.0.0.5:8000",
        "ftp://10.0.0.5:21",
        "http://user:pw@10.0.0.5:80",
        "http://10.0.0.5:99999",
        "http://10.0.0.5:0",
        "http://10.0.0.5:80?x=1",
        "http://bad_host:80",
        "http://10.0.0.5:80,http://x:80",
        "http://10.0.0.5:80`)",
    ],
)
def test_server_url_needs_scheme_host_and_port(url: str) -> None:
    assert locs(upstream={"servers": [{"url": url}]}) == ["upstream.servers.servers.0.url"]


def test_server_weights_and_bounds() -> None:
    assert locs(upstream={"servers": [{"url": "http://a.test:80", "weight": -1}]}) == ["upstream.servers.servers.0.weight"]
    assert {loc.rsplit(".", 1)[0] for loc in locs(upstream={"servers": [{"url": "http://a.test:80", "weight": "1"}]})} == {
        "upstream.servers.servers.0.weight"
    }
    upstream = build(upstream={"servers": [{"url": "http://a.test:80", "weight": 0.7}]}).upstream
    assert isinstance(upstream, ServersUpstream) and upstream.servers[0].weight == 0.7
    too_many = [{"url": f"http://10.0.{n // 250}.{n % 250}:80"} for n in range(MAX_SERVERS + 1)]
    assert locs(upstream={"servers": too_many}) == ["upstream.servers.servers"]
    assert locs(upstream={"servers": []}) == ["upstream.servers.servers"]
    dup = [{"url": "http://a.test:80"}, {"url": "http://a.test:80"}]
    assert locs(upstream={"servers": dup}) == ["upstream.servers.servers"]


def test_canary_weight_is_a_percentage_1_to_99() -> None:
    up = {"servers": [{"url": "http://10.0.0.6:8000"}]}
    canary = build(canary={"weight": 10, "upstream": up}).canary
    assert canary is not None and canary.weight == 10
    for bad in (0, 100, -5):
        assert locs(canary={"weight": bad, "upstream": up}) == ["canary.weight"]


@pytest.mark.parametrize("cidr", ["10.0.0.0/33", "10.0.0", "abc", "10.0.0.0/8,192.168.0.0/16", "::1/129"])
def test_allowed_client_ips_must_be_cidrs(cidr: str) -> None:
    assert locs(allowed_client_ips=[cidr]) == ["allowed_client_ips.0"]


def test_allowed_client_ips_are_normalised() -> None:
    assert build(allowed_client_ips=["10.1.2.3/8", "::1"]).allowed_client_ips == ["10.0.0.0/8", "::1/128"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("expected_status_code", 100), ("initial_delay", -1), ("path", "health"), ("enable", "maybe"), ("interval", float("nan"))],
)
def test_health_check_fields(field: str, value: Any) -> None:
    assert locs(health_check={field: value}) == [f"health_check.{field}"]


@pytest.mark.parametrize(
    "check",
    [{"interval": 7200}, {"interval": 0}, {"max_retries": 0}, {"max-retries": 0}, {"max_wait_time": -1},
     {"expected-status-code": 999}, {"initial-delay": 0}, {"max-wait-time": 1.5}],
)
def test_every_value_backendai_model_health_check_accepts_is_accepted(check: dict[str, Any]) -> None:
    assert build(health_check=check).health_check.enable is False


def test_upstream_tls_needs_a_pem_and_a_host_name() -> None:
    assert locs(upstream_tls={"ca_pem": "not a pem"}) == ["upstream_tls.ca_pem"]
    assert locs(upstream_tls={"server_name": "bad name"}) == ["upstream_tls.server_name"]


def test_unknown_fields_and_wrong_types_are_rejected_with_every_error_listed() -> None:
    found = locs(authority="a/b", revision="3", hostz=["a.test"], protocol="udp")
    assert set(found) == {"authority", "revision", "hostz", "protocol"}


def test_revision_must_be_a_non_negative_integer() -> None:
    for bad in (-1, 1.5, True, "3"):
        assert locs(revision=bad) == ["revision"]


def test_tcp_ingress_rules() -> None:
    tcp_up = {"servers": [{"url": "tcp://10.0.0.5:5432"}]}
    assert build(protocol="tcp", hosts=[], upstream=tcp_up).protocol == "tcp"
    assert "tcp://host:port" in errors_of(protocol="tcp", hosts=[])[0]["msg"]
    assert "route by path" in errors_of(protocol="tcp", hosts=[], path_prefix="/x", upstream=tcp_up)[0]["msg"]
    weighted = {"servers": [{"url": "tcp://10.0.0.5:5432", "weight": 3}]}
    assert "cannot weight tcp servers" in errors_of(protocol="tcp", hosts=[], upstream=weighted)[0]["msg"]
    assert "http(s) URL" in errors_of(upstream=tcp_up)[0]["msg"]


def test_ai_proxy_multi_instances() -> None:
    up = {
        "kind": "ai-proxy-multi",
        "instances": [
            {"name": "openai", "url": "https://api.openai.example:443", "weight": 3,
             "checks": {"path": "/v1/models", "headers": {"Authorization": "Bearer x"}, "interval": 5}},
            {"name": "local-vllm", "url": "http://10.0.0.7:8000"},
        ],
    }
    ingress = build(upstream=up)
    assert ingress.upstream.kind == "ai-proxy-multi"
    bad = {"kind": "ai-proxy-multi", "instances": [{"name": "a", "url": "http://a.test:80",
                                                    "checks": {"headers": {"X": "a\r\nInjected: 1"}}}]}
    assert locs(upstream=bad) == ["upstream.ai-proxy-multi.instances.0.checks.headers"]
    dup = {"kind": "ai-proxy-multi", "instances": [{"name": "a", "url": "http://a.test:80"}, {"name": "a", "url": "http://b.test:80"}]}
    assert locs(upstream=dup) == ["upstream.ai-proxy-multi.instances"]


def test_entrypoints_cannot_carry_commas_or_be_empty() -> None:
    assert locs(entrypoints=["web,websecure"]) == ["entrypoints.0"]
    assert locs(entrypoints=[]) == ["entrypoints"]


def test_a_request_cannot_name_one_ingress_twice_and_is_bounded() -> None:
    with pytest.raises(ValidationError) as info:
        IngressFile.model_validate({"ingresses": [BASE, BASE]})
    assert "appears more than once" in field_errors(info.value)[0]["msg"]
    with pytest.raises(ValidationError):
        RemoveRequest.model_validate({"ingresses": [{"authority": "a", "id": "b", "revision": 1}] * 1001})


def test_field_errors_never_echo_the_input() -> None:
    secret = "Bearer super-secret-token"
    errors = errors_of(hosts=[secret])
    assert secret not in str(errors)


@pytest.mark.parametrize("field", ["authority", "id"])
def test_a_trailing_newline_is_not_a_label(field: str) -> None:
    # Python's `$` matches before a final newline; every pattern must anchor with \Z.
    assert locs(**{field: "llama\n"}) == [field]
    assert locs(hosts=["llama.test\n"]) == ["hosts.0"]
    assert locs(path_prefix="/v1\n") == ["path_prefix"]


@given(st.lists(st.from_regex(r"\A[0-9]{1,3}\Z"), min_size=4, max_size=4))
def test_dotted_quads_are_accepted_exactly_when_ip_address_accepts_them(octets: list[str]) -> None:
    host = ".".join(octets)
    try:
        ipaddress.ip_address(host)
        valid = True
    except ValueError:
        valid = False
    try:
        parse_upstream_url(f"http://{host}:8000", ("http",))
        accepted = True
    except ValueError:
        accepted = False
    assert accepted is valid, host


def test_equal_sub_models_are_shared_and_each_record_keeps_its_own_bytes() -> None:
    def one(iid: str, **fields: Any) -> Ingress:
        return Ingress.model_validate({"authority": "a", "id": iid, "revision": 1, "hosts": ["a.test"],
                                       "upstream": {"servers": [{"url": "http://10.0.0.1:80"}]}, **fields})

    a, b = one("a", timeouts={"dial": 5}, health_check={"enable": True}), one("b", timeouts={"dial": 5}, health_check={"enable": True})
    assert a.timeouts is b.timeouts and a.health_check is b.health_check
    assert one("c").health_check is one("d").health_check
    # 1 and 1.0 are equal values, but each record keeps the JSON it was given (no rewrite on restart).
    whole, fraction = one("e", timeouts={"dial": 1}), one("f", timeouts={"dial": 1.0})
    assert '"dial":1,' in whole.model_dump_json() and '"dial":1.0,' in fraction.model_dump_json()
    assert Ingress.model_validate_json(fraction.model_dump_json()).model_dump_json() == fraction.model_dump_json()


_TCP = {"protocol": "tcp", "hosts": [], "upstream": {"kind": "servers", "servers": [{"url": "tcp://10.0.0.5:5432"}]},
        "allowed_client_ips": ["10.0.0.0/8"]}
REFUSED_SINCE = [
    {"allowed_client_ips": ["10.0.0.0/8"], "allowed_client_ips_strategy": {"depth": 1, "excluded_ips": ["10.9.0.0/16"]}},
    {"tls": {"domains": [{"main": "llama.example.test"}]}},
    {"upstream_tls": {"server_name": "model.internal"}},
    {**_TCP, "allowed_client_ips_strategy": {"depth": 1}},
    {**_TCP, "health_check": {"path": "/ready", "expected_status_code": 204}},
]


@pytest.mark.parametrize("changes", REFUSED_SINCE)
def test_a_record_stored_with_a_combination_now_refused_still_loads_as_it_was(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        build(**changes)
    # What an earlier version stored, read back at start-up: loaded with the combination kept.
    body = {**BASE, **changes}
    record = decode_record(json.dumps({"source": "api", "ingress": body}))
    dumped = record.ingress.model_dump(mode="json")
    assert all(_within(value, dumped[key]) for key, value in changes.items()), dumped


def _within(given: Any, loaded: Any) -> bool:
    """True when every value `given` names is in `loaded` (which also holds the defaults)."""
    if isinstance(given, dict):
        return all(_within(v, loaded.get(k)) for k, v in given.items())
    if isinstance(given, list):
        return len(given) == len(loaded) and all(_within(g, x) for g, x in zip(given, loaded, strict=True))
    return bool(given == loaded)
