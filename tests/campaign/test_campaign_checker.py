"""The campaign's checker on handmade histories: a clean one passes, and each planted defect is caught by its rule."""

from __future__ import annotations

import json

from tests.campaign.checker import Fault, History, Look, Request, Stored, check, conflicts_with_cause

ROOT = "traefik/worker_c"
RECORDS = "records"


def upsert(revision: int, status: int = 204, at: float = 0.0, client: str = "a", ingress: str = "c/x") -> Request:
    return Request(client, "upsert", ingress, revision, at, at + 0.01, status)


def record(revision: int) -> str:
    return json.dumps({"source": "api", "ingress": {"revision": revision}})


def ingress_keys(name: str, revision: int) -> dict[str, str | None]:
    return {
        f"{ROOT}/http/services/{name}/loadBalancer/servers/0/url": "http://10.0.0.1:80",
        f"{ROOT}/http/routers/{name}/rule": "Host(`x.test`)",
        f"{ROOT}/http/routers/{name}/service": name,
        f"{RECORDS}/c/x": record(revision),
    }


def clean() -> History:
    return History(
        requests=[upsert(1, at=0), upsert(2, at=1), upsert(1, status=409, at=2, client="b"), upsert(2, at=3, client="b")],
        final={"c/x": Stored(2, bodies=frozenset({"b1"}))},
        etcd=[(2, ingress_keys("c_x", 1)), (3, {f"{RECORDS}/c/x": record(2)})],
        roots=[ROOT], records_prefix=RECORDS,
        diff_exit={ROOT: 0}, served={"traefik-a": {"x.test": (200, "b1")}}, ready={"s1": 200, "s2": 200}, leading={"s1": True, "s2": False},
        rss={"s1": [80, 95, 90]}, mirrors=[("s1", 3, "ab12", "ab12"), ("s2", 2, "cd34", "cd34")],
    )


def rules(history: History) -> list[int]:
    return sorted({v.rule for v in check(history)})


def test_a_clean_history_passes() -> None:
    assert check(clean()) == []


def test_a_build_that_answers_204_before_committing_breaks_rule_1() -> None:
    history = clean()
    history.requests.append(upsert(3, at=4))  # acknowledged, never written
    assert rules(history) == [1]
    assert "acknowledged and lost, stored 2: a upsert rev 3" in str(check(history)[0])


def test_a_build_that_skips_the_revision_compare_breaks_rule_1() -> None:
    history = clean()
    history.requests.append(upsert(3, at=4))
    history.requests.append(upsert(2, at=5, client="stale"))  # older, acknowledged, and it won
    history.final["c/x"] = Stored(2)
    assert 1 in rules(history)


def test_a_409_without_a_newer_request_breaks_rule_2() -> None:
    history = clean()
    history.requests.append(upsert(7, status=409, at=6))
    assert rules(history) == [2]


def test_a_build_that_deletes_a_service_before_its_router_breaks_rule_3() -> None:
    history = clean()
    service = f"{ROOT}/http/services/c_x/loadBalancer/servers/0/url"
    history.etcd += [(4, {service: None}), (5, {f"{ROOT}/http/routers/c_x/rule": None, f"{ROOT}/http/routers/c_x/service": None})]
    [violation] = check(history)
    assert violation.rule == 3 and "at etcd revision 4" in violation.detail and "c_x" in violation.detail


def test_a_record_revision_that_goes_back_breaks_rule_3() -> None:
    history = clean()
    history.etcd.append((4, {f"{RECORDS}/c/x": record(1)}))
    assert rules(history) == [3]


def test_the_end_state_rules_4_to_7() -> None:
    history = clean()
    history.diff_exit[ROOT] = 2
    history.served["traefik-b"] = {"x.test": (404, "")}
    history.leading["s2"] = True
    history.ready["s2"] = 503
    history.rss["s2"] = [80, 400]
    assert rules(history) == [4, 5, 6, 7]


def test_a_removal_acknowledged_must_be_the_end_state() -> None:
    history = clean()
    history.requests.append(Request("a", "remove", "c/x", 3, 7, 7.01, 204))
    history.final["c/x"] = Stored(3, removed=True)
    history.served = {"traefik-a": {"x.test": (404, "")}}
    assert check(history) == []
    history.final["c/x"] = Stored(3, removed=False)
    assert rules(history) == [1, 5]


def test_an_acknowledged_upsert_lost_to_a_stale_one_of_its_revision_breaks_rule_1() -> None:
    """A build that acknowledges an upsert it never wrote, then writes a stale request of the same
    revision with other content: the stored revision is the acknowledged one, its content is not."""
    history = clean()
    acked = Request("a", "upsert", "c/x", 3, 4, 4.01, 204, content="mine")
    history.requests.append(acked)
    history.final["c/x"] = Stored(3, bodies=frozenset({"b1"}), content="mine")
    assert check(history) == []
    history.requests.append(Request("stale", "upsert", "c/x", 3, 5, 5.01, 204, content="other"))
    assert check(history) == []  # two answers at one revision: etcd holds one of them
    history.final["c/x"] = Stored(3, bodies=frozenset({"b1"}), content="other")
    history.requests.remove(acked)
    history.requests.append(Request("a", "upsert", "c/x", 3, 4, 4.01, 0, content="mine"))
    assert check(history) == []  # the one etcd holds was the only acknowledged one
    history.requests[-1] = acked
    history.requests.pop(-2)
    assert rules(history) == [1]
    assert "revision 3 acknowledged with other content" in str(check(history)[0])


def test_an_unanswered_request_may_win_an_answered_newer_one_may_not_be_beaten() -> None:
    history = clean()
    history.requests.append(upsert(3, status=0, at=4))  # timed out, yet committed
    history.final["c/x"] = Stored(3, bodies=frozenset({"b1"}))
    assert check(history) == []
    history.requests[-1] = upsert(3, status=409, at=4)  # refused, yet stored: it is not what etcd holds
    assert 1 in rules(history)


def test_a_409_for_a_call_of_several_ingresses_needs_one_cause_among_them() -> None:
    history = clean()
    history.final["c/y"] = Stored(1, bodies=frozenset({"b1"}))
    history.served["traefik-a"]["y.test"] = (200, "b1")
    history.requests += [upsert(1, at=4, ingress="c/y"),
                         Request("a", "upsert", "c/x", 2, 5, 5.1, 409, batch=9), Request("a", "upsert", "c/y", 2, 5, 5.1, 409, batch=9)]
    assert check(history) == []  # c/x had revision 2 already: the whole call is refused
    history.requests[-2] = Request("a", "upsert", "c/x", 9, 5, 5.1, 409, batch=9)
    assert rules(history) == [2]


def remove(revision: int, status: int = 204, at: float = 0.0, client: str = "a") -> Request:
    return Request(client, "remove", "c/x", revision, at, at + 0.01, status)


def test_an_older_upsert_after_an_acknowledged_remove_breaks_rule_1() -> None:
    # Removed at 3; a remove at 5 answered 204 without writing (a no-op over the tombstone); an
    # upsert of 4 sent after it brings the ingress back: both the end state and the history show it.
    history = clean()
    history.requests += [remove(3, at=4), remove(5, at=5), upsert(4, at=6)]
    history.etcd += [(4, {f"{RECORDS}/c/x": record(3)}), (5, {f"{RECORDS}/c/x": record(4)})]
    history.final["c/x"] = Stored(4, bodies=frozenset({"b1"}))
    found = check(history)
    assert {v.rule for v in found} == {1}
    assert any("changes acknowledged and lost, stored 4: a remove rev 5" in str(v) for v in found)
    assert any("remove of revision 5 answered 204" in str(v) for v in found)
    # The promise kept: the remove at 5 left its tombstone, and the upsert of 4 was refused.
    history.requests[-1] = Request("a", "upsert", "c/x", 4, 6, 6.01, 409, refused_by=5)
    history.etcd[-1] = (5, {f"{RECORDS}/c/x": record(5)})
    history.final["c/x"] = Stored(5, removed=True)
    history.served = {"traefik-a": {"x.test": (404, "")}}
    assert check(history) == []


def test_a_live_record_at_the_revision_of_an_acknowledged_remove_breaks_rule_1() -> None:
    history = clean()
    history.requests += [upsert(3, status=0, at=4), remove(3, at=5)]  # the upsert timed out; the remove won the tie
    history.final["c/x"] = Stored(3, bodies=frozenset({"b1"}))
    assert any("live at revision 3, which an acknowledged remove removed" in str(v) for v in check(history))


def test_a_tombstone_no_remove_asked_for_breaks_rule_1() -> None:
    history = clean()
    history.final["c/x"] = Stored(2, removed=True)
    history.served = {"traefik-a": {"x.test": (404, "")}}
    assert rules(history) == [1]
    history.requests.append(Request("a", "remove", "c/x", None, 5, 5.1, 204))
    assert check(history) == []


def test_a_host_answered_by_a_server_it_does_not_have_breaks_rule_5() -> None:
    history = clean()
    history.served["traefik-a"]["x.test"] = (200, "another-backend")
    assert rules(history) == [5]


def test_a_409_naming_the_revision_a_remove_without_one_took_has_a_cause() -> None:
    # A remove without a revision takes the stored one. An upsert committed while its reply
    # was lost, then removed at its own revision, is answered 409 naming that revision.
    stored = {"c/x": {1, 2, 3}}
    lost = Request("a", "upsert", "c/x", 3, 4.0, 6.0, 409, refused_by=3)
    bare = Request("b", "remove", "c/x", None, 4.1, 4.2, 204)
    assert conflicts_with_cause([lost, bare], stored) == []
    assert len(conflicts_with_cause([lost], stored)) == 1
    after = Request("b", "remove", "c/x", None, 6.5, 6.6, 204)  # sent after the answer: no cause
    assert len(conflicts_with_cause([lost, after], stored)) == 1
    older = Request("a", "upsert", "c/x", 3, 4.0, 6.0, 409, refused_by=2)  # names an older revision
    assert len(conflicts_with_cause([older, bare], stored)) == 1
    never = Request("a", "upsert", "c/x", 4, 4.0, 6.0, 409, refused_by=4)  # a revision etcd never held
    assert len(conflicts_with_cause([never, bare], stored)) == 1


def test_every_planted_defect_finds_what_it_patches() -> None:
    """A defect whose target was renamed fails loudly instead of planting nothing (each planted in a process of its own)."""
    import subprocess
    import sys

    from tests.campaign.defects import DEFECTS

    for name in DEFECTS:
        code = f"from tests.campaign.defects import DEFECTS; DEFECTS[{name!r}]()"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (name, done.stderr[-2000:])
    code = "import exporter.plan.guards as g; from tests.campaign.defects import DEFECTS; del g.order_changes; DEFECTS['keeps-keys']()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "has no 'order_changes'" in done.stderr


def test_a_sidecar_whose_mirror_differs_from_etcd_at_its_revision_breaks_rule_8() -> None:
    history = clean()
    history.mirrors.append(("s2", 3, "ee00", "ab12"))  # at revision 3 it holds what etcd never held there
    assert rules(history) == [8]
    assert str(check(history)[0]) == "rule 8 (s2): /v1/mirror at revision 3 has digest ee00, etcd read there ab12"


def partitioned(history: History, sidecar: str = "s1", start: float = 10, end: float = 18, revision: int = 3) -> History:
    history.faults.append(Fault("partition", sidecar, start, end, "cut", revision))
    history.looks += [Look(start + 0.5 * n, sidecar, 200 if n < 3 else 503, "" if n < 3 else "etcd unreachable: no answer", 0)
                      for n in range(int((end - start) * 2))]
    history.looks += [Look(end + 0.5 * n, sidecar, 200, "", 3) for n in range(12)]
    return history


def test_a_partitioned_sidecar_that_answers_204_breaks_rule_9() -> None:
    history = partitioned(clean())
    assert check(history) == []
    history.requests.append(Request("a", "upsert", "c/x", 2, 11, 11.2, 204, sidecar="s1"))
    assert check(history) == []  # revision 2 was acknowledged before: answered from what it holds
    history.requests.append(Request("a", "upsert", "c/x", 3, 12, 12.2, 204, sidecar="s1"))
    history.final["c/x"] = Stored(3, bodies=frozenset({"b1"}))
    history.etcd.append((4, {f"{RECORDS}/c/x": record(3)}))
    assert rules(history) == [9]
    history.requests[-1] = Request("a", "upsert", "c/x", 3, 12, 18.5, 204, sidecar="s1")  # answered after the heal
    assert check(history) == []


def test_a_partitioned_sidecar_that_stays_ready_breaks_rule_10() -> None:
    history = partitioned(clean())
    history.looks = [look if look.at >= 18 else Look(look.at, look.sidecar, 200, "", 0) for look in history.looks]
    assert rules(history) == [10]
    short = partitioned(clean(), end=13)  # shorter than TTL + 2 s: not judged
    short.looks = [look if look.at >= 13 else Look(look.at, look.sidecar, 200, "", 0) for look in short.looks]
    assert check(short) == []


def test_a_health_document_from_a_deposed_leader_breaks_rule_11() -> None:
    history = clean()
    history.election_key, history.health_prefix = "records.leader", "records.health"
    doc = json.dumps({"leader": "s1", "at": 1})
    history.election_holder = "s1"
    history.etcd += [(5, {"records.health/c/x": doc}), (6, {"records.leader": None}), (7, {"records.leader": "s2"})]
    assert check(history) == []
    history.etcd.append((8, {"records.health/c/x": doc}))
    [violation] = check(history)
    assert violation.rule == 11 and "revision 8 by 's1', while 's2' held" in violation.detail


def test_a_mirror_that_never_catches_up_after_a_heal_breaks_rule_12() -> None:
    history = partitioned(clean())
    history.mirror_prefixes = [RECORDS]
    assert check(history) == []
    history.looks = [look if look.at < 18 else Look(look.at, look.sidecar, 200, "", 2) for look in history.looks]
    [violation] = check(history)
    assert violation.rule == 12 and "etcd at 3" in violation.detail
    history.faults.append(Fault("etcd-kill", "m0", 17, 20))  # etcd itself was impaired meanwhile: not judged
    assert check(history) == []


def test_a_204_while_etcd_is_out_of_space_breaks_rule_9() -> None:
    history = clean()  # c/x live at revision 2 from etcd revision 3
    history.faults.append(Fault("nospace", "3 puts of 1 MiB", 10, 14, start_revision=3))
    history.requests.append(Request("a", "upsert", "c/x", 2, 11, 11.2, 204, sidecar="s1"))
    assert check(history) == []  # what etcd held at the alarm: a no-op
    history.requests.append(Request("a", "upsert", "c/x", 3, 12, 12.2, 204, sidecar="s1"))
    history.final["c/x"] = Stored(3, bodies=frozenset({"b1"}))
    history.etcd.append((4, {f"{RECORDS}/c/x": record(3)}))
    assert rules(history) == [9]
    history.requests[-1] = Request("a", "upsert", "c/x", 3, 12, 14.5, 204, sidecar="s1")  # answered after the disarm
    assert check(history) == []


def test_under_nospace_a_remove_of_an_ingress_etcd_holds_removed_is_a_no_op() -> None:
    history = clean()
    history.faults.append(Fault("nospace", "3 puts of 1 MiB", 10, 14, start_revision=3))
    history.requests.append(Request("a", "remove", "c/x", None, 12, 12.1, 204, sidecar="s1"))
    assert rules(history) == [9]  # c/x was live: the remove had to be written, and etcd refused every put
    history.etcd[-1] = (3, {f"{RECORDS}/c/x": json.dumps({"ingress": {"revision": 2}, "removed": True})})
    assert 9 not in rules(history)  # a tombstone: nothing to write (rule 1 judges the rest of this history)
    history.requests.append(Request("a", "remove", "c/x", 3, 12, 12.1, 204, sidecar="s1"))
    assert 9 in rules(history)  # a newer revision than the tombstone's: a write


def test_a_partitioned_sidecar_may_answer_a_remove_of_what_it_never_stored() -> None:
    history = partitioned(clean())
    history.requests.append(Request("a", "remove", "c/new", None, 11, 11.1, 204, sidecar="s1"))
    assert 9 not in rules(history)  # nothing to remove: a no-op
    history.requests.insert(-1, Request("a", "upsert", "c/new", 1, 10.5, 10.6, 0, sidecar="s2"))
    assert 9 in rules(history)  # an upsert may have stored it: the remove had to be written
