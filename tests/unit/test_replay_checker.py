"""The history checker used by the replay tests must itself detect dangling references."""

from tests.replay import dangling


def test_dangling_finds_every_kind_of_missing_reference() -> None:
    kv = {
        "r/http/routers/a/service": "missing-svc",
        "r/http/routers/a/middlewares/00": "missing-mw",
        "r/http/routers/b/service": "s",
        "r/http/routers/c/service": "api@internal",
        "r/http/services/s/weighted/services/00/name": "gone",
        "r/http/services/t/loadBalancer/serversTransport": "no-transport",
        "r/tcp/routers/d/service": "tcp-missing",
    }
    assert sorted(dangling(kv, "r")) == [
        "r/http/routers/a/middlewares/00 -> missing-mw",
        "r/http/routers/a/service -> missing-svc",
        "r/http/services/s/weighted/services/00/name -> gone",
        "r/http/services/t/loadBalancer/serversTransport -> no-transport",
        "r/tcp/routers/d/service -> tcp-missing",
    ]


def test_dangling_is_empty_for_a_consistent_root() -> None:
    kv = {
        "r/http/routers/a/service": "s",
        "r/http/routers/a/middlewares/00": "m",
        "r/http/services/s/loadBalancer/servers/000/url": "http://x:1",
        "r/http/middlewares/m/ipAllowList/sourceRange/00": "10.0.0.0/8",
    }
    assert dangling(kv, "r") == []
