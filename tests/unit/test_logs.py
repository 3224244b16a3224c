"""The JSON log sink: one parseable line per record, whatever the record carries."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from loguru import logger

from exporter import logs
from exporter.config import LogSettings
from exporter.logs import info_line, setup_logging

Stderr = pytest.CaptureFixture[str]


@pytest.fixture(autouse=True)
def _direct_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test here configures the sinks: the direct lines' state is put back after it, or a later
    test's own loguru sink would miss the lines that went straight to the JSON sink."""
    monkeypatch.setattr(logs._Direct, "on", False)
    monkeypatch.setattr(logs._Direct, "patchers", list(logs._Direct.patchers))


@pytest.fixture
def stderr(capsys: Stderr) -> Iterator[Stderr]:
    setup_logging(LogSettings(level="INFO", format="json"))
    yield capsys
    logger.remove()


def _lines(err: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in err.splitlines()]


def test_a_line_carries_time_level_message_module_and_the_bound_fields(stderr: Stderr) -> None:
    with logger.contextualize(request_id="r1"):
        logger.bind(route="/v2/ingress/upsert", status=204).info("push {} {}", "POST", 204)
    logger.debug("below the level")
    [line] = _lines(stderr.readouterr().err)
    assert line["level"] == "INFO" and line["message"] == "push POST 204" and line["module"] == __name__
    assert (line["request_id"], line["route"], line["status"]) == ("r1", "/v2/ingress/upsert", 204)
    assert "T" in line["time"]


def test_a_direct_line_is_the_line_loguru_writes_for_the_same_fields(stderr: Stderr) -> None:
    logs.add_patcher(_mark)
    with logger.contextualize(request_id="r1"):
        logger.bind(route="/v2/ingress/upsert", status=204).info("{}", "push POST 204 {x}")
    info_line("push POST 204 {x}", request_id="r1", route="/v2/ingress/upsert", status=204)
    through, direct = _lines(stderr.readouterr().err)
    assert set(through) == set(direct) == {"time", "level", "message", "module", "request_id", "route", "status", "marked"}
    assert {k: v for k, v in through.items() if k != "time"} == {k: v for k, v in direct.items() if k != "time"}
    assert direct["time"][:16] == through["time"][:16] and direct["time"][-6:] == through["time"][-6:]  # local and aware


def _mark(record: Any) -> None:
    record["extra"]["marked"] = True


def test_a_direct_line_goes_through_loguru_to_any_other_sink(capsys: Stderr) -> None:
    setup_logging(LogSettings(level="INFO", format="human"))
    try:
        info_line("push POST 204", request_id="r2")
        assert "push POST 204" in capsys.readouterr().err
        setup_logging(LogSettings(level="WARNING", format="json"))
        info_line("push POST 204", request_id="r3")
        assert capsys.readouterr().err == ""
    finally:
        logger.remove()


def test_values_the_fast_encoder_refuses_are_still_written(stderr: Stderr) -> None:
    undecodable = b"ingress-\xff.json".decode(errors="surrogateescape")
    logger.bind(path=undecodable).warning("cannot read {}", undecodable)
    logger.bind(revision=2**70, counts={1: "one"}).info("big")
    first, second = _lines(stderr.readouterr().err)
    assert first["level"] == "WARNING" and first["message"].startswith("cannot read ingress-")
    assert second["revision"] == 2**70 and second["counts"] == {"1": "one"}


def test_an_exception_is_named_by_its_type_and_value_without_a_traceback(stderr: Stderr) -> None:
    try:
        raise ValueError("bad value")
    except ValueError:
        logger.exception("failed")
    err = stderr.readouterr().err
    [line] = _lines(err)
    assert line["exception"] == "ValueError: bad value" and "Traceback" not in err


@pytest.mark.parametrize(("level", "kept"), [("INFO", ["txn rev=3"]), ("DEBUG", ["reconcile: + k", "txn rev=3"])])
def test_the_first_runs_log_leaves_out_per_key_lines_unless_at_debug(capsys: Stderr, level: str, kept: list[str]) -> None:
    from exporter.metrics import Metrics
    from exporter.plan.plan import Change, UnitPlan
    from exporter.reconcile.apply import log_unrequested

    setup_logging(LogSettings(level=level, format="json"), key_changes=False)
    try:
        log_unrequested(Metrics(), [UnitPlan("root", [Change("k", None, "v")], [])], {}, {})
        logger.info("txn rev=3")
    finally:
        logger.remove()
    assert [line["message"] for line in _lines(capsys.readouterr().err)] == kept
