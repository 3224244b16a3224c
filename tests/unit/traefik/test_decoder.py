"""The decoder traps run over keys the exporter does not own (pure)."""

from __future__ import annotations

import pytest

from exporter.traefik.decoder import decoder_problem

R = "traefik/worker_edge"


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("tls", "x", "tls node"),
        ("http/routerz/a/rule", "Host(`a`)", "unknown section"),
        ("http/routers/123/rule", "Host(`a`)", "all digits"),
        ("http/routers/a@file/rule", "Host(`a`)", "'@'"),
        ("http/routers/a/rulez", "Host(`a`)", "unknown field 'rulez'"),
        ("http/routers/a/priority", "abc", "must be a number"),
        ("http/services/a/loadBalancer/passHostHeader", "yes", "true or false"),
        ("http/middlewares/a/headerz/x", "1", "unknown field 'headerz'"),
        ("tcp/services/a/loadBalancer/servers/0/weight", "1", "tcp load-balancer server"),
    ],
)
def test_keys_that_freeze_traefik_are_named_with_the_reason(key: str, value: str, why: str) -> None:
    problem = decoder_problem(R, f"{R}/{key}", value)
    assert problem is not None and why in problem


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("_meta/owner", "traefik-etcd-exporter"),
        ("anything/else", "x"),
        ("http", "ignored on an inner node"),
        ("http/routers/a/rule", "Host(`a`)"),
        ("HTTP/Routers/A/Priority", "7"),
        ("http/middlewares/m/basicAuth/users/0", "u:$apr1$x"),
        ("http/services/s/loadBalancer/servers/0/weight", "3"),
        ("http/serversTransports/t/insecureSkipVerify", "true"),
        ("tls/stores/default/defaultCertificate/certFile", "PEM"),
        ("tcp/routers/r/tls/passthrough", "true"),
    ],
)
def test_valid_keys_are_never_reported(key: str, value: str) -> None:
    assert decoder_problem(R, f"{R}/{key}", value) is None
