"""Rendering: each feature's keys, the decoder traps, and templates that Traefik would reject."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.errors import TemplateError
from exporter.keys import KeyLayout
from exporter.render.flatten import flatten
from exporter.render.renderer import BUILTIN_TEMPLATES, Renderer
from exporter.render.traefik_schema import Fragment
from tests.helpers import ingress

ROOT = "traefik/worker_test"


@pytest.fixture
def renderer() -> Renderer:
    return Renderer(KeyLayout(), ["web"])


def keys(renderer: Renderer, **fields: object) -> dict[str, str]:
    return renderer.render(ingress("llama", **fields)).kv


def rel(kv: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix(ROOT + "/"): v for k, v in kv.items()}


def with_shared(renderer: Renderer, **fields: object) -> dict[str, str]:
    """The ingress's own keys and those of the shared objects it references, under the root."""
    rendered = renderer.render(ingress("llama", **fields))
    return rel({**rendered.kv, **{k: v for obj in rendered.shared for k, v in obj.kv.items()}})


UP = {"servers": [{"url": "http://10.0.0.5:8000", "weight": 2}]}


def test_router_and_load_balancer(renderer: Renderer) -> None:
    kv = rel(keys(renderer, upstream=UP))
    assert kv == {
        "http/routers/test_llama/rule": "Host(`llama.test`)",
        "http/routers/test_llama/service": "test_llama",
        "http/routers/test_llama/priority": "101",
        "http/routers/test_llama/entryPoints/00": "web",
        "http/services/test_llama/loadBalancer/servers/000/url": "http://10.0.0.5:8000",
        "http/services/test_llama/loadBalancer/servers/000/weight": "2",
    }


def test_values_equal_to_traefiks_defaults_are_not_written(renderer: Renderer) -> None:
    kv = rel(keys(renderer, upstream={"servers": [{"url": "http://10.0.0.5:8000"}, {"url": "http://10.0.0.6:8000", "weight": 3}]}))
    lb = "http/services/test_llama/loadBalancer"
    assert {k: v for k, v in kv.items() if k.startswith(lb)} == {
        f"{lb}/servers/000/url": "http://10.0.0.5:8000",  # weight 1: Traefik's default
        f"{lb}/servers/001/url": "http://10.0.0.6:8000",
        f"{lb}/servers/001/weight": "3",
    }  # passHostHeader true: Traefik's default


def test_a_load_balancer_with_every_server_ejected_keeps_one_key(renderer: Renderer) -> None:
    up = {"servers": [{"url": "http://10.0.0.5:8000"}]}
    kv = rel(renderer.render(ingress("llama", upstream=up), frozenset({"http://10.0.0.5:8000"})).kv)
    # Its only key keeps the service defined: a router naming a missing service answers 404, not 503.
    assert {k: v for k, v in kv.items() if "/services/" in k} == {"http/services/test_llama/loadBalancer/passHostHeader": "true"}


def test_several_hosts_and_path_prefix(renderer: Renderer) -> None:
    kv = rel(keys(renderer, upstream=UP, hosts=["a.test", "*.b.example.test"], path_prefix="/v1"))
    assert kv["http/routers/test_llama/rule"] == (
        "(Host(`a.test`) || HostRegexp(`^[a-z0-9-]+\\.b\\.example\\.test$`)) && PathPrefix(`/v1`)"
    )
    # Longer prefixes win over shorter ones on the same host.
    assert kv["http/routers/test_llama/priority"] == "103"


def test_entrypoints_override_the_default(renderer: Renderer) -> None:
    kv = rel(keys(renderer, upstream=UP, entrypoints=["websecure", "web"]))
    assert kv["http/routers/test_llama/entryPoints/00"] == "websecure"
    assert kv["http/routers/test_llama/entryPoints/01"] == "web"


def test_canary_is_a_weighted_service_over_two_load_balancers(renderer: Renderer) -> None:
    kv = rel(keys(renderer, upstream=UP, canary={"weight": 10, "upstream": {"servers": [{"url": "http://10.0.0.6:8000"}]}}))
    assert kv["http/services/test_llama/weighted/services/00/name"] == "test_llama_primary"
    assert kv["http/services/test_llama/weighted/services/00/weight"] == "90"
    assert kv["http/services/test_llama/weighted/services/01/name"] == "test_llama_canary"
    assert kv["http/services/test_llama/weighted/services/01/weight"] == "10"
    assert kv["http/services/test_llama_primary/loadBalancer/servers/000/url"] == "http://10.0.0.5:8000"
    assert kv["http/services/test_llama_canary/loadBalancer/servers/000/url"] == "http://10.0.0.6:8000"


def test_ip_allow_list_middleware(renderer: Renderer) -> None:
    kv = with_shared(renderer, upstream=UP, allowed_client_ips=["10.0.0.0/8", "192.168.1.7"])
    name = kv["http/routers/test_llama/middlewares/00"]
    assert name.startswith("shared-allow-")
    assert kv[f"http/middlewares/{name}/ipAllowList/sourceRange/00"] == "10.0.0.0/8"
    assert kv[f"http/middlewares/{name}/ipAllowList/sourceRange/01"] == "192.168.1.7/32"


def test_upstream_tls_is_a_servers_transport(renderer: Renderer) -> None:
    from exporter.render.root_keys import generate_certificate

    pem = generate_certificate().cert_pem
    kv = with_shared(renderer, upstream={"servers": [{"url": "https://10.0.0.5:8443"}]},
                     upstream_tls={"ca_pem": pem, "server_name": "model.internal"})
    name = kv["http/services/test_llama/loadBalancer/serversTransport"]
    assert name.startswith("shared-transport-")
    assert kv[f"http/serversTransports/{name}/serverName"] == "model.internal"
    assert kv[f"http/serversTransports/{name}/rootCAs/00"] == pem


def test_tcp_router_and_service(renderer: Renderer) -> None:
    kv = rel(keys(renderer, protocol="tcp", hosts=[], upstream={"servers": [{"url": "tcp://10.0.0.5:5432"}]}))
    assert kv == {
        "tcp/routers/test_llama/rule": "HostSNI(`*`)",
        "tcp/routers/test_llama/service": "test_llama",
        "tcp/routers/test_llama/entryPoints/00": "web",
        "tcp/services/test_llama/loadBalancer/servers/000/address": "10.0.0.5:5432",
    }
    sni = rel(keys(renderer, protocol="tcp", hosts=["db.test"], upstream={"servers": [{"url": "tcp://10.0.0.5:5432"}]}))
    assert sni["tcp/routers/test_llama/rule"] == "HostSNI(`db.test`)"
    assert sni["tcp/routers/test_llama/tls/passthrough"] == "true"


def test_ai_proxy_multi_renders_a_weighted_service_over_instances(renderer: Renderer) -> None:
    up = {"kind": "ai-proxy-multi", "instances": [{"name": "openai", "url": "https://api.openai.example:443", "weight": 3},
                                                  {"name": "vllm", "url": "http://10.0.0.7:8000"}]}
    kv = rel(keys(renderer, upstream=up))
    assert kv["http/services/test_llama/weighted/services/00/name"] == "test_llama_i_openai"
    assert kv["http/services/test_llama/weighted/services/00/weight"] == "3"
    assert kv["http/services/test_llama_i_openai/loadBalancer/servers/000/url"] == "https://api.openai.example:443"
    assert kv["http/services/test_llama_i_openai/loadBalancer/passHostHeader"] == "false"


def test_ejected_servers_are_left_out(renderer: Renderer) -> None:
    up = {"servers": [{"url": "http://10.0.0.5:8000"}, {"url": "http://10.0.0.6:8000"}]}
    rendered = renderer.render(ingress("llama", upstream=up), frozenset({"http://10.0.0.5:8000"}))
    urls = [v for k, v in rendered.kv.items() if k.endswith("/url")]
    assert urls == ["http://10.0.0.6:8000"]


# ----- decoder traps


def test_list_indices_are_zero_padded_to_the_list_bound(renderer: Renderer) -> None:
    servers = [{"url": f"http://10.0.0.{n}:8000"} for n in range(1, 13)]
    kv = rel(keys(renderer, upstream={"servers": servers}))
    urls = [(k, v) for k, v in sorted(kv.items()) if k.endswith("/url")]
    # String order of the keys equals list order: Traefik sorts indices as strings.
    assert [v for _, v in urls] == [s["url"] for s in servers]
    assert urls[10][0].endswith("/servers/010/url")


def test_object_names_are_lowercase_unique_never_digits_and_without_at(renderer: Renderer) -> None:
    names = set()
    for authority, iid in [("a-b", "c"), ("a", "b-c"), ("x", "1a"), ("e", "llama")]:
        rendered = renderer.render(ingress(iid, authority=authority, upstream=UP))
        for obj in rendered.objects:
            name = obj.rsplit("/", 1)[1]
            assert name == name.lower() and "@" not in name and not name.isdigit()
            names.add(obj.lower())
    assert len(names) == 8  # router + service each, no collision between a-b/c and a/b-c


def test_no_list_element_carries_a_comma() -> None:
    with pytest.raises(ValueError, match="must not contain ','"):
        Fragment.model_validate({"http": {"middlewares": {"m": {"ipAllowList": {"sourceRange": ["10.0.0.0/8,1.2.3.4"]}}}}})


def test_flatten_writes_booleans_and_integers_as_traefik_reads_them() -> None:
    fragment = Fragment.model_validate(
        {"http": {"serversTransports": {"t": {"insecureSkipVerify": True, "maxIdleConnsPerHost": 4}}}}
    )
    assert flatten(fragment, "r") == {
        "r/http/serversTransports/t/insecureSkipVerify": "true",
        "r/http/serversTransports/t/maxIdleConnsPerHost": "4",
    }


# ----- templates that would freeze Traefik


def _override(tmp_path: Path, body_replace: tuple[str, str]) -> Renderer:
    text = (BUILTIN_TEMPLATES / "http.json.j2").read_text()
    assert body_replace[0] in text
    (tmp_path / "http.json.j2").write_text(text.replace(*body_replace))
    return Renderer(KeyLayout(), ["web"], tmp_path)


def test_template_rendering_priority_abc_is_rejected_with_its_name(tmp_path: Path) -> None:
    bad = _override(tmp_path, ('"priority": {{ priority }}', '"priority": "abc"'))
    with pytest.raises(TemplateError) as info:
        bad.render(ingress("llama", upstream=UP))
    assert "http.json.j2" in info.value.title
    assert any("priority" in e["loc"] for e in info.value.data["errors"])


def test_template_rendering_an_unknown_field_is_rejected(tmp_path: Path) -> None:
    bad = _override(tmp_path, ('"rule":', '"rulez": "x", "rule":'))
    with pytest.raises(TemplateError) as info:
        bad.render(ingress("llama", upstream=UP))
    assert any(e["loc"].endswith("rulez") for e in info.value.data["errors"])


def test_template_naming_an_object_outside_the_ingress_is_rejected(tmp_path: Path) -> None:
    bad = _override(tmp_path, ('"routers": {"{{ name }}"', '"routers": {"someone_else"'))
    with pytest.raises(TemplateError, match="not named test_llama"):
        bad.render(ingress("llama", upstream=UP))


def test_template_with_undefined_variable_fails_loudly(tmp_path: Path) -> None:
    bad = _override(tmp_path, ('"service": "{{ name }}"', '"service": "{{ nmae }}"'))
    with pytest.raises(TemplateError, match="nmae"):
        bad.render(ingress("llama", upstream=UP))


def test_template_sandbox_blocks_python_internals(tmp_path: Path) -> None:
    bad = _override(tmp_path, ('"service": "{{ name }}"', '"service": "{{ name.__class__.__mro__ }}"'))
    with pytest.raises(TemplateError):
        bad.render(ingress("llama", upstream=UP))


def test_a_user_template_dir_overrides_only_the_files_it_has(tmp_path: Path) -> None:
    custom = _override(tmp_path, ('"priority": {{ priority }}', '"priority": 7'))
    assert custom.render(ingress("llama", upstream=UP)).kv["traefik/worker_test/http/routers/test_llama/priority"] == "7"
    tcp = custom.render(ingress("db", protocol="tcp", hosts=[], upstream={"servers": [{"url": "tcp://10.0.0.5:5432"}]}))
    assert "traefik/worker_test/tcp/routers/test_db/rule" in tcp.kv


def test_rendering_is_cached_by_content(renderer: Renderer) -> None:
    one = ingress("llama", upstream=UP)
    assert renderer.render(one) is renderer.render(ingress("llama", upstream=UP))
    assert renderer.render(one) is not renderer.render(ingress("llama", upstream=UP, revision=2))


@pytest.mark.parametrize("protocol", ["http", "tcp"])
def test_a_group_with_no_routable_server_gets_weight_zero_while_the_other_has_one(renderer: Renderer, protocol: str) -> None:
    scheme = "tcp" if protocol == "tcp" else "http"
    p, c = f"{scheme}://10.0.0.5:80", f"{scheme}://10.0.0.6:80"
    ing = ingress("llama", protocol=protocol, hosts=[] if protocol == "tcp" else ["llama.test"],
                  upstream={"servers": [{"url": p}]}, canary={"weight": 10, "upstream": {"servers": [{"url": c}]}})

    def weights(ejected: set[str]) -> tuple[str, str]:
        kv = rel(renderer.render(ing, frozenset(ejected)).kv)
        base = f"{protocol}/services/test_llama/weighted/services"
        return kv[f"{base}/00/weight"], kv[f"{base}/01/weight"]

    assert weights(set()) == ("90", "10")
    assert weights({c}) == ("90", "0")
    assert weights({p}) == ("0", "10")
    assert weights({p, c}) == ("90", "10")  # all down: the configured split, answering 503


def test_canary_min_ready_holds_its_weight_until_enough_servers_are_routable(renderer: Renderer) -> None:
    p, c1, c2 = "http://10.0.0.5:80", "http://10.0.0.6:80", "http://10.0.0.7:80"

    def weights(min_ready: int | str | None, ejected: set[str]) -> tuple[str, str]:
        canary: dict[str, object] = {"weight": 20, "upstream": {"servers": [{"url": c1}, {"url": c2}]}}
        if min_ready is not None:
            canary["min_ready"] = min_ready
        kv = rel(renderer.render(ingress("llama", upstream={"servers": [{"url": p}]}, canary=canary), frozenset(ejected)).kv)
        base = "http/services/test_llama/weighted/services"
        return kv[f"{base}/00/weight"], kv[f"{base}/01/weight"]

    assert weights(None, {c1}) == ("80", "20")  # any one routable canary server
    assert weights("all", {c1}) == ("80", "0") and weights("all", set()) == ("80", "20")
    assert weights(2, {c2}) == ("80", "0") and weights(1, {c2}) == ("80", "20")


def test_edge_fields_write_a_transport_and_middlewares_before_the_users_own(renderer: Renderer) -> None:
    kv = with_shared(renderer, upstream=UP, timeouts={"dial": 5, "response_header": 0.25}, keepalive=False, middlewares=["cors@file"],
                     limits={"max_body_bytes": 1024, "max_in_flight": 4, "rate": {"average": 10, "burst": 20, "period": 2}},
                     retry={"attempts": 2, "initial_interval": 0.1}, allowed_client_ips=["10.0.0.0/8"])
    name = kv["http/services/test_llama/loadBalancer/serversTransport"]
    transport = f"http/serversTransports/{name}"
    assert kv[f"{transport}/forwardingTimeouts/dialTimeout"] == "5s"
    assert kv[f"{transport}/forwardingTimeouts/responseHeaderTimeout"] == "250ms"
    assert kv[f"{transport}/maxIdleConnsPerHost"] == "-1"
    chain = [kv[f"http/routers/test_llama/middlewares/{n:02d}"] for n in range(6)]
    assert [c.rsplit("-", 1)[0] for c in chain] == [
        "shared-allow", "shared-rate", "shared-inflight", "shared-body", "shared-retry", "cors@file"]
    allow, rate, inflight, body, retry = chain[:5]
    assert kv[f"http/middlewares/{body}/buffering/maxRequestBodyBytes"] == "1024"
    assert kv[f"http/middlewares/{inflight}/inFlightReq/amount"] == "4"
    limit = f"http/middlewares/{rate}/rateLimit"
    assert (kv[f"{limit}/average"], kv[f"{limit}/burst"], kv[f"{limit}/period"]) == ("10", "20", "2s")
    assert kv[f"http/middlewares/{retry}/retry/initialInterval"] == "100ms"
    assert kv[f"http/middlewares/{allow}/ipAllowList/sourceRange/00"] == "10.0.0.0/8"


def test_equal_edge_definitions_are_one_shared_object_named_from_its_content(renderer: Renderer) -> None:
    edge = {"upstream": UP, "limits": {"max_in_flight": 4}, "timeouts": {"dial": 5}, "allowed_client_ips": ["10.0.0.0/8"]}
    one = renderer.render(ingress("one", **edge))
    two = renderer.render(ingress("two", **edge))
    assert [o.path for o in one.shared] == [o.path for o in two.shared] and len(one.shared) == 3
    assert all(a is b for a, b in zip(one.shared, two.shared, strict=True))  # one instance per definition
    # No object of the ingress's own carries an edge definition.
    assert not any("/middlewares/" in k.split("/routers/")[0] or "/serversTransports/" in k for k in one.kv)
    other = renderer.render(ingress("three", **{**edge, "limits": {"max_in_flight": 5}}))
    assert {o.path for o in other.shared} - {o.path for o in one.shared} == {
        next(o.path for o in other.shared if "/shared-inflight-" in o.path)}
    # Another root has objects of its own.
    elsewhere = renderer.render(ingress("one", authority="other", **edge))
    assert not {o.path for o in elsewhere.shared} & {o.path for o in one.shared}


def test_without_edge_fields_or_defaults_an_ingress_writes_no_transport_and_the_same_rule(renderer: Renderer) -> None:
    kv = rel(keys(renderer, upstream=UP, path_prefix="/v1"))
    assert not any("serversTransport" in k for k in kv)
    assert kv["http/routers/test_llama/rule"] == "Host(`llama.test`) && PathPrefix(`/v1`)"
    assert kv["http/routers/test_llama/priority"] == "103"


def test_an_allowlist_sets_the_rule_and_the_priority_of_its_longest_path(renderer: Renderer) -> None:
    kv = rel(keys(renderer, upstream=UP, paths=[{"prefix": "/v1/", "methods": ["GET", "POST"]}, {"exact": "/v1/chat/completions"}]))
    rule = kv["http/routers/test_llama/rule"]
    allowed = "(PathPrefix(`/v1/`) && (Method(`GET`) || Method(`POST`))) || Path(`/v1/chat/completions`)"
    assert rule.startswith(f"Host(`llama.test`) && ((({allowed}) && !PathRegexp(`%|;|")
    assert rule.endswith(" || (Path(`/health`) && (Method(`GET`) || Method(`HEAD`))))")
    assert kv["http/routers/test_llama/priority"] == str(100 + len("/v1/chat/completions"))


@pytest.mark.parametrize("edge", [
    {"path_prefix": "/v1", "blocked_segments": ["internal"]},
    {"profile": "openai", "paths": [{"prefix": "/extra/", "methods": ["GET"]}]},
])
def test_router_middlewares_and_transport_render_alike_for_every_upstream_kind(renderer: Renderer, edge: dict[str, object]) -> None:
    # What an http ingress's router-level and transport fields write does not depend on its
    # upstream's kind: the real-Traefik proof on `servers` holds for the other kinds too.
    fields: dict[str, object] = {
        **edge, "hosts": ["llama.test", "*.models.test"], "entrypoints": ["web", "websecure"], "tls": True,
        "allowed_client_ips": ["10.0.0.0/8"], "allowed_client_ips_strategy": {"depth": 1}, "middlewares": ["cors@file"],
        "upstream_tls": {"server_name": "model.internal"}, "timeouts": {"dial": 5}, "keepalive": False,
        "limits": {"max_body_bytes": 10, "max_in_flight": 2, "rate": {"average": 5}}, "retry": {"attempts": 2},
    }
    url = "https://10.0.0.5:8443"
    upstreams = {
        "servers": {"kind": "servers", "servers": [{"url": url}]},
        "ai-proxy-multi": {"kind": "ai-proxy-multi", "instances": [{"name": "a", "url": url}]},
        "plugin": {"kind": "tcp-connect", "servers": [{"url": url}], "config": {"team": "x"}},
    }
    shared: dict[str, dict[str, str]] = {}
    for kind, upstream in upstreams.items():
        kv = with_shared(renderer, upstream=upstream, **fields)
        shared[kind] = {k: v for k, v in kv.items() if not k.startswith("http/services/")}
        balancers = {k.rpartition("/loadBalancer/")[0] for k in kv if "/loadBalancer/" in k}
        transport = kv[f"{min(balancers)}/loadBalancer/serversTransport"]
        assert transport.startswith("shared-transport-")
        assert balancers and all(kv[f"{b}/loadBalancer/serversTransport"] == transport for b in balancers), kind
    assert shared["servers"] == shared["ai-proxy-multi"] == shared["plugin"]


@pytest.mark.parametrize("upstream", [
    {"kind": "servers", "servers": [{"url": "http://10.0.0.5:8000", "weight": 3}, {"url": "http://10.0.0.6:8000"}]},
    {"kind": "ai-proxy-multi", "instances": [{"name": "a", "url": "http://10.0.0.5:8000", "weight": 3}]},
    {"kind": "tcp-connect", "servers": [{"url": "http://10.0.0.5:8000", "weight": 3}], "config": {"team": "x"}},
])
def test_a_canary_group_renders_like_a_primary_of_its_kind_and_a_plugin_group_like_servers(
    renderer: Renderer, upstream: dict[str, object]
) -> None:
    alone = rel(keys(renderer, upstream=upstream))
    split = rel(keys(renderer, upstream=UP, canary={"weight": 10, "upstream": upstream}))
    services = {k.replace("test_llama_canary", "test_llama", 1): v.replace("test_llama_canary", "test_llama")
                for k, v in split.items() if k.startswith("http/services/test_llama_canary")}
    assert services == {k: v for k, v in alone.items() if k.startswith("http/services/")}
    if upstream["kind"] == "tcp-connect":
        as_servers = rel(keys(renderer, upstream={"kind": "servers", "servers": upstream["servers"]}))
        assert alone == as_servers
