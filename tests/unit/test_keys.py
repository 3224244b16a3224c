"""KeyLayout: every key name derived from the settings in one place."""

from __future__ import annotations

import pytest

from exporter.config import Settings
from exporter.keys import IngressRef, KeyLayout


def test_defaults_follow_the_records_prefix() -> None:
    layout = Settings().layout()
    assert layout.root("edge") == "traefik/worker_edge"
    assert layout.roots_prefix == "traefik/worker_"
    assert layout.health_prefix == "traefik-etcd-exporter/records.health"
    assert layout.election_key == "traefik-etcd-exporter/records.leader"
    ref = IngressRef("edge", "llama")
    assert layout.record_key(ref) == "traefik-etcd-exporter/records/edge/llama"
    assert layout.record_ref(layout.record_key(ref)) == ref
    assert layout.health_ref(layout.health_key(ref)) == ref
    assert str(ref) == "edge/llama" and ref == ("edge", "llama")


def test_explicit_health_prefix_and_election_key_win() -> None:
    layout = Settings.model_validate({"health": {"prefix": "h/"}, "leader": {"key": "e"}}).layout()
    assert layout.health_key(IngressRef("a", "b")) == "h/a/b" and layout.election_key == "e"


def test_record_and_health_keys_of_anything_else_name_no_ingress() -> None:
    layout = KeyLayout(records_prefix="r")
    for key in ("r/a", "r/a/b/c", "r/", "r//b", "other/a/b", "r.health/a/b"):
        assert layout.record_ref(key) is None, key
    assert layout.health_ref("r.health/a/b/c") is None


def test_objects_under_a_root_name_their_ingress_and_root_keys_are_owned() -> None:
    layout = KeyLayout("t/w_{authority}/x")
    root = layout.root("edge")
    key = f"{root}/http/services/edge_llama_canary/loadBalancer/servers/000/url"
    assert layout.object_of(key) == f"{root}/http/services/edge_llama_canary"
    assert layout.owner_of_key(key) == IngressRef("edge", "llama")
    assert layout.object_name(IngressRef("edge", "llama")) == "edge_llama"
    assert layout.owner_of_key(f"{root}/http/routers/nounderscore/rule") is None
    assert layout.object_of(f"{root}/tls/stores/default/defaultCertificate/certFile") is None
    assert layout.is_root_owned(root, f"{root}/_meta/owner")
    assert not layout.is_root_owned(root, f"{root}/http/routers/edge_llama/rule")


def test_a_single_shared_root() -> None:
    layout = KeyLayout("traefik")
    assert layout.root("anything") == "traefik" and layout.roots_prefix == "traefik/"
    assert layout.owner_of_key("traefik/http/routers/a_b/rule") == IngressRef("a", "b")


def test_free_text_authorities_get_distinct_safe_labels_and_dns_labels_stay_verbatim() -> None:
    layout = KeyLayout()
    assert layout.object_label("worker-1") == "worker-1"
    labels = {a: layout.object_label(a) for a in ("worker_1", "Worker-1", "Worker_1", "worker 1", "0", "x" * 200)}
    assert len(set(labels.values())) == len(labels)
    for authority, label in labels.items():
        assert label.split("--")[0] in ("worker-1", "0", "x" * 40) and len(label) <= 63
        assert layout.owner_of_object(f"r/http/routers/{label}_svc") == IngressRef(authority, "svc")
    assert layout.root("worker_1") == "traefik/worker_worker_1" and layout.object_name(IngressRef("worker_1",
                                                                                                  "c")) == f"{labels['worker_1']}_c"
    # A derived-looking label nobody registered names no ingress (left alone as foreign).
    assert KeyLayout().owner_of_object(f"r/http/routers/{labels['worker_1']}_svc") is None


def test_roots_that_are_string_prefixes_of_others_are_found() -> None:
    from exporter.keys import overlapping_roots

    roots = ["traefik/worker_1", "traefik/worker_10", "traefik/worker_2", "traefik/worker_100", "traefik/worker_1x/kv"]
    assert overlapping_roots(roots) == [
        ("traefik/worker_1", "traefik/worker_10"), ("traefik/worker_1", "traefik/worker_100"),
        ("traefik/worker_10", "traefik/worker_100"), ("traefik/worker_1", "traefik/worker_1x/kv"),
    ]
    # A segment after the authority ends the overlap (Traefik refuses a rootKey ending in '/').
    layout = KeyLayout("traefik/worker_{authority}/kv")
    assert overlapping_roots(layout.root(a) for a in ("1", "10", "100")) == []


def test_object_labels_are_the_same_when_kept_and_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    import exporter.keys

    fresh = {a: KeyLayout().object_label(a) for a in ("worker-1", "Worker_1", "worker 2")}
    monkeypatch.setattr(exporter.keys, "_LABELS_KEPT", 1)  # only the first authority's label is kept
    layout = KeyLayout()
    for _ in range(2):
        assert {a: layout.object_label(a) for a in fresh} == fresh
    for authority, label in fresh.items():
        assert layout.owner_of_object(f"r/http/routers/{label}_svc") == IngressRef(authority, "svc")
