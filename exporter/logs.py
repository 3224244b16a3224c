"""Logging setup: loguru, human lines on a TTY and JSON lines otherwise (or as configured).

A JSON line is `{"time", "level", "message", ...}` plus the fields bound to the record
(a transaction line carries `revision` and `ingresses`). Secrets are never passed to the
logger in the first place: tokens and passwords are not logged, plan values are redacted.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar

import orjson
from loguru import logger

from .config import LogSettings


class _Direct:
    """The JSON sink's INFO lines written without a loguru record (`info_line`): on while the sink is the one configured."""

    on: ClassVar[bool] = False
    patchers: ClassVar[list[Callable[[Any], None]]] = []
    zones: ClassVar[dict[int, timezone]] = {}  # the local zone by UTC offset: loguru's times are local and aware


def _json_sink(message: Any) -> None:
    record = message.record
    line = _line(record["time"], record["level"].name, record["message"], record["name"], record["extra"])
    if record["exception"] is not None:
        line["exception"] = f"{record['exception'].type.__name__}: {record['exception'].value}"
    _write(line)


def _line(at: datetime, level: str, message: str, module: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"time": at.isoformat(), "level": level, "message": message, "module": module, **extra}


def _now() -> datetime:
    offset = time.localtime().tm_gmtoff
    zone = _Direct.zones.get(offset) or _Direct.zones.setdefault(offset, timezone(timedelta(seconds=offset)))
    return datetime.now(zone)


def info_line(message: str, **extra: Any) -> None:
    """One INFO line with the fields `extra`, as the caller's `logger.bind(**extra).info(message)` writes it.

    A line per request is on the push path: a loguru record costs about 20 us there (the caller's
    frame, the process and thread, the time), the line built from its fields a third of it. Only the
    JSON sink takes this way; any other goes through loguru.
    """
    if not _Direct.on:
        logger.opt(depth=1).bind(**extra).info("{}", message)
        return
    record = {"extra": extra}
    _patch(record)
    module = sys._getframe(1).f_globals["__name__"]
    _write(_line(_now(), "INFO", message, module, record["extra"]))


def add_patcher(patcher: Callable[[Any], None]) -> None:
    """`patcher` runs on every record, loguru's and `info_line`'s (it sees and changes `record["extra"]`)."""
    if patcher not in _Direct.patchers:
        _Direct.patchers.append(patcher)
    logger.configure(patcher=_patch)


def _patch(record: Any) -> None:
    for patch in _Direct.patchers:
        patch(record)


def _write(line: dict[str, Any]) -> None:
    try:
        text = orjson.dumps(line, default=str, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        # What orjson refuses and the standard library writes (a file name's undecodable bytes
        # as surrogates, an integer past 64 bits): the line is kept either way.
        text = json.dumps(line, default=str) + "\n"
    sys.stderr.write(text)


def _without_key_changes(record: Any) -> bool:
    return "changed_key" not in record["extra"]


def setup_logging(settings: LogSettings, *, key_changes: bool = True) -> None:
    """Replace loguru's default sink with the configured one on stderr.

    `key_changes` False leaves out the per-key lines of the exporter's own writes (each bound with
    `changed_key`) unless the level is DEBUG: the first run's log, where the transaction lines suffice.
    """
    logger.remove()
    _Direct.on = False
    # No filter at all unless one is asked for: it would run on every record.
    keep = None if key_changes or settings.level.upper() == "DEBUG" else _without_key_changes

    as_json = settings.format == "json" or (settings.format == "auto" and not sys.stderr.isatty())
    if as_json:
        # The sink builds its line from the record: "{message}" spares loguru formatting a
        # default line (time, level, caller) for every record that is never written.
        logger.add(_json_sink, level=settings.level.upper(), format="{message}", backtrace=False, diagnose=False,
                   filter=keep)
        # The filter keeps every line without a `changed_key`, as `info_line`'s are.
        _Direct.on = logger.level(settings.level.upper()).no <= logger.level("INFO").no
    else:
        logger.add(
            sys.stderr,
            level=settings.level.upper(),
            format="<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> {message}",
            backtrace=False,
            diagnose=False,
            filter=keep,
        )
