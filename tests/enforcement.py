"""The enforcement table: for every field of the ingress model, each protocol and upstream kind,
the test that proves its effect, or that proves it is refused.

A row is keyed by the field's path; inside an upstream the path names its kind
(`upstream[servers].servers.url`, `canary.upstream[ai-proxy-multi].instances.name`). A cell says
where the effect is proven: `traefik` (requests through a real Traefik), `health` (the health
engine: probes, ejections, weights the exporter writes), `plugin` (handed to the kind's checker
plugin), or `refused` (a 400 naming the field). tests/unit/test_enforcement.py walks the pydantic
models and fails for a field without a row, a cell left out, or a cited test that does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Where = Literal["traefik", "health", "plugin", "refused"]


@dataclass(frozen=True)
class Cell:
    """Where one field's effect is proven for one protocol and kind, and by which tests."""

    where: Where
    tests: tuple[str, ...]


def traefik(*tests: str) -> Cell:
    return Cell("traefik", tests)


def health(*tests: str) -> Cell:
    return Cell("health", tests)


def plugin(*tests: str) -> Cell:
    return Cell("plugin", tests)


def refused(*tests: str) -> Cell:
    return Cell("refused", tests)


F = "tests/integration/test_traefik_features.py::"
X = "tests/integration/test_enforcement_traefik.py::"
E = "tests/integration/test_edge.py::"
H = "tests/integration/test_health.py::"
P = "tests/unit/health/test_health_probes.py::"
R = "tests/unit/render/test_render.py::"
S = "tests/unit/health/test_health_state.py::"

HOST = F + "test_host_rule_routes_only_its_host"
TCP = F + "test_tcp_route"
TCP_ALLOW = F + "test_a_tcp_allowlist_admits_only_its_clients"
TCP_SNI = F + "test_a_tcp_allowlist_with_hosts_routes_tls_passthrough_by_sni_for_its_clients_only"
TCP_CANARY = X + "test_a_tcp_canary_splits_connections_between_its_groups"
TCP_HEALTH = X + "test_a_tcp_health_check_ejects_a_server_that_refuses_connections"
CANARY = F + "test_canary_split_within_tolerance"
RATIOS = "tests/integration/test_backendai.py::test_a_backendai_circuit_is_served_with_its_ratios_and_removed_without_revision"
AI = H + "test_ai_proxy_multi_one_instance_down_shifts_its_share"
PLUGIN = H + "test_a_third_party_plugin_from_its_entry_point_declares_checkers"
EJECT = H + "test_a_dead_backend_is_ejected_in_bounds_and_comes_back"
PROBE = P + "test_path_expected_status_and_max_wait_time_decide_an_http_probe"
TCP_PROBE = P + "test_a_tcp_probe_connects_and_a_refused_connection_is_a_tcp_failure"
INSTANCE = P + "test_instance_checks_override_the_ingress_health_check_and_reach_the_probe"
THRESHOLD = S + "test_failures_degrade_then_eject_at_the_threshold_and_a_success_resets"
GRACE = S + "test_failures_inside_the_initial_delay_never_eject"
# The router, its middlewares and the transport render alike whatever the upstream's kind; a
# canary group renders like a primary group of its kind, and a plugin kind's group like servers.
KIND_ALIKE = R + "test_router_middlewares_and_transport_render_alike_for_every_upstream_kind"
GROUP_ALIKE = R + "test_a_canary_group_renders_like_a_primary_of_its_kind_and_a_plugin_group_like_servers"
NO_EFFECT = "tests/integration/test_push_api.py::test_a_field_traefik_would_ignore_is_refused_naming_it_and_changes_nothing"
STALE = "tests/integration/test_push_api.py::test_stale_and_conflicting_revisions_are_409_and_write_nothing"

HTTP_KINDS = ("http/servers", "http/ai-proxy-multi", "http/plugin")
Row = dict[str, Cell]


def router(*tests: str, tcp: Cell | None = None) -> Row:
    """An http router-level field: proven on `servers`, and alike for the other kinds; `tcp` its tcp cell."""
    row = {"http/servers": traefik(*tests), "http/ai-proxy-multi": traefik(*tests, KIND_ALIKE),
           "http/plugin": traefik(*tests, KIND_ALIKE)}
    return row | {"tcp/servers": tcp if tcp is not None else refused(NO_EFFECT)}


def each(cell: Cell, *columns: str) -> Row:
    return dict.fromkeys(columns, cell)


def _group(prefix: str, canary: bool) -> dict[str, Row]:
    """The rows of one upstream group (`upstream` or `canary.upstream`), by kind."""
    alike = (GROUP_ALIKE,) if canary else ()
    served_http = traefik(CANARY, *alike) if canary else traefik(HOST)
    tcp_served = traefik(TCP_CANARY if canary else TCP)
    no_tcp = refused(NO_EFFECT)
    rows = {
        f"{prefix}[servers].kind": {"http/servers": served_http, "tcp/servers": tcp_served},
        f"{prefix}[servers].servers.url": {"http/servers": traefik(F + "test_several_servers_all_receive_traffic", *alike),
                                           "tcp/servers": tcp_served},
        f"{prefix}[servers].servers.weight": {"http/servers": traefik(RATIOS, *alike), "tcp/servers": no_tcp},
        f"{prefix}[ai-proxy-multi].kind": {"http/ai-proxy-multi": traefik(AI, *alike), "tcp/ai-proxy-multi": no_tcp},
        f"{prefix}[plugin].kind": {"http/plugin": plugin(PLUGIN, *alike), "tcp/plugin": no_tcp},
        f"{prefix}[plugin].servers.url": {"http/plugin": traefik(PLUGIN, *alike), "tcp/plugin": no_tcp},
        f"{prefix}[plugin].servers.weight": {"http/plugin": traefik(RATIOS, GROUP_ALIKE), "tcp/plugin": no_tcp},
        f"{prefix}[plugin].config": {"http/plugin": plugin(PLUGIN), "tcp/plugin": no_tcp},
    }
    for name in ("name", "url", "weight"):
        rows[f"{prefix}[ai-proxy-multi].instances.{name}"] = {"http/ai-proxy-multi": traefik(AI, *alike), "tcp/ai-proxy-multi": no_tcp}
    for name in ("path", "headers", "interval", "max_retries", "max_wait_time", "expected_status_code"):
        rows[f"{prefix}[ai-proxy-multi].instances.checks.{name}"] = {"http/ai-proxy-multi": health(INSTANCE, AI),
                                                                     "tcp/ai-proxy-multi": no_tcp}
    return rows


def _health_check() -> dict[str, Row]:
    def row(servers: Cell, ai: Cell, tcp: Cell) -> Row:
        return {"http/servers": servers, "http/ai-proxy-multi": ai, "http/plugin": plugin(PLUGIN), "tcp/servers": tcp}

    defaults = health(INSTANCE)  # the ingress's block is every instance's default
    return {
        "health_check.enable": row(health(EJECT), health(INSTANCE, AI), health(TCP_HEALTH)),
        "health_check.path": row(health(PROBE, EJECT), defaults, refused(NO_EFFECT)),
        "health_check.interval": row(health(EJECT), defaults, health(TCP_HEALTH)),
        "health_check.max_retries": row(health(EJECT, THRESHOLD), defaults, health(TCP_HEALTH, THRESHOLD)),
        "health_check.max_wait_time": row(health(PROBE), defaults, health(TCP_PROBE, TCP_HEALTH)),
        "health_check.expected_status_code": row(health(PROBE), defaults, refused(NO_EFFECT)),
        "health_check.initial_delay": row(health(H + "test_initial_delay_grace_no_ejection_and_no_traffic_before_first_success", GRACE),
                                          health(GRACE, INSTANCE), health(TCP_HEALTH, GRACE)),
    }


ALL = (*HTTP_KINDS, "tcp/servers")

TABLE: dict[str, Row] = {
    "authority": router(HOST, tcp=traefik(TCP)),
    "id": router(HOST, tcp=traefik(TCP)),
    "revision": each(health(STALE), *ALL),  # the exporter's own rule: an older revision is a 409
    "protocol": router(HOST, tcp=traefik(TCP)),
    "hosts": router(HOST, tcp=traefik(TCP_SNI)),
    "path_prefix": router(F + "test_path_prefix_routes_only_under_it"),
    "entrypoints": router(X + "test_entrypoints_choose_where_an_http_router_listens", tcp=traefik(TCP)),
    **_group("upstream", canary=False),
    "canary.weight": router(CANARY, tcp=traefik(TCP_CANARY)),
    "canary.min_ready": each(health(R + "test_canary_min_ready_holds_its_weight_until_enough_servers_are_routable",
                                    H + "test_a_dead_canary_gets_no_traffic_and_a_dead_primary_neither"), *ALL),
    **_group("canary.upstream", canary=True),
    **_health_check(),
    "allowed_client_ips": router(F + "test_ip_allow_list_answers_403_outside_the_range", tcp=traefik(TCP_ALLOW, TCP_SNI)),
    "allowed_client_ips_strategy.depth": router(F + "test_allow_list_ip_strategy_depth_reads_x_forwarded_for"),
    "allowed_client_ips_strategy.excluded_ips": router(X + "test_excluded_ips_skip_the_load_balancers_in_x_forwarded_for"),
    "upstream_tls.ca_pem": router(F + "test_upstream_tls_verified_with_the_test_ca"),
    "upstream_tls.server_name": router(F + "test_upstream_tls_verified_with_the_test_ca"),
    "upstream_tls.insecure_skip_verify": router(F + "test_upstream_tls_verified_with_the_test_ca"),
    "upstream_tls.ca_file": router(E + "test_a_rotated_ca_file_is_trusted_within_2s_without_a_traefik_restart"),
    "tls": router(F + "test_router_tls_true_serves_https_with_the_default_certificate"),
    "tls.cert_resolver": router(X + "test_a_cert_resolver_is_asked_for_the_router_domains"),
    "tls.domains.main": router(X + "test_a_cert_resolver_is_asked_for_the_router_domains"),
    "tls.domains.sans": router(X + "test_a_cert_resolver_is_asked_for_the_router_domains"),
    "tls.options": router(X + "test_tls_options_from_the_file_provider_set_the_handshake_rules"),
    "middlewares": router(F + "test_a_middleware_from_the_file_provider_is_applied_after_the_exporters_own"),
    "timeouts.dial": router(E + "test_response_header_timeout_504s_a_hung_server_while_a_stream_flows_past_it"),
    "timeouts.response_header": router(E + "test_response_header_timeout_504s_a_hung_server_while_a_stream_flows_past_it"),
    "timeouts.idle": router(E + "test_response_header_timeout_504s_a_hung_server_while_a_stream_flows_past_it"),
    "keepalive": router(E + "test_keepalive_false_opens_one_upstream_connection_per_request"),
    "profile": router(E + "test_profile_openai_routes_only_its_allowlist_and_no_hostile_spelling"),
    "paths.prefix": router(E + "test_paths_and_blocked_segments_of_its_own"),
    "paths.exact": router(E + "test_paths_and_blocked_segments_of_its_own"),
    "paths.regex": router(E + "test_paths_and_blocked_segments_of_its_own"),
    "paths.methods": router(E + "test_paths_and_blocked_segments_of_its_own"),
    "blocked_segments": router(E + "test_paths_and_blocked_segments_of_its_own",
                               E + "test_blocked_segments_alone_keep_path_prefix_routing"),
    "limits.max_body_bytes": router(E + "test_limits_answer_413_and_429_at_the_configured_points"),
    "limits.max_in_flight": router(E + "test_limits_answer_413_and_429_at_the_configured_points"),
    "limits.rate.average": router(E + "test_limits_answer_413_and_429_at_the_configured_points"),
    "limits.rate.burst": router(E + "test_limits_answer_413_and_429_at_the_configured_points"),
    "limits.rate.period": router(E + "test_limits_answer_413_and_429_at_the_configured_points"),
    "retry.attempts": router(E + "test_retry_retries_only_requests_that_never_reached_a_server"),
    "retry.initial_interval": router(E + "test_retry_retries_only_requests_that_never_reached_a_server"),
}

# Cells whose cited test exercises the field's family but not this field's own effect on the
# real Traefik (its keys are proven by the render tests). Listed so that none is added silently.
NOT_YET_MEASURED = {
    "timeouts.dial": "a dial timeout needs an address that never answers a SYN; loopback refuses at once",
    "timeouts.idle": "Traefik closing an idle upstream connection after idleConnTimeout is not observed by a test",
    "limits.rate.period": "the limits test sends within one period",
    "retry.initial_interval": "the retry test does not time the backoff",
}
