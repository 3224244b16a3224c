"""The JSON log sink: one parseable line per record, whatever the record carries."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from loguru import logger

from exporter.config import LogSettings
from exporter.logs import setup_logging

Stderr = pytest.CaptureFixture[str]


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
