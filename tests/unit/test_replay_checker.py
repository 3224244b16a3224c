"""The history checker used by the replay tests must itself detect dangling references."""

from tests.replay import dangling, owner_of, touched_views


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


def test_deleting_a_shared_object_is_checked_against_every_ingress_that_names_it() -> None:
    # The revision touches only the shared object: its referrer is another ingress, untouched.
    by_owner = {
        "a_one": {"r/http/routers/a_one/service": "a_one", "r/http/routers/a_one/middlewares/00": "shared-rate-1",
                  "r/http/services/a_one/loadBalancer/servers/000/url": "http://x:1"},
        "shared": {},
    }
    views = touched_views(by_owner, {"shared"})
    assert [d for view in views for d in dangling(view, "r")] == ["r/http/routers/a_one/middlewares/00 -> shared-rate-1"]
    by_owner["shared"] = {"r/http/middlewares/shared-rate-1/rateLimit/average": "5"}
    # An ingress's own revision sees the shared objects it names.
    assert [d for view in touched_views(by_owner, {"a_one"}) for d in dangling(view, "r")] == []
    assert owner_of("r/http/middlewares/shared-rate-1/rateLimit/average", "r") == "shared"
