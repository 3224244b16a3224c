"""Logging setup: loguru, human lines on a TTY and JSON lines otherwise (or as configured).

A JSON line is `{"time", "level", "message", ...}` plus the fields bound to the record
(a transaction line carries `revision` and `ingresses`). Secrets are never passed to the
logger in the first place: tokens and passwords are not logged, plan values are redacted.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import orjson
from loguru import logger

from .config import LogSettings


def _json_sink(message: Any) -> None:
    record = message.record
    line = {
        "time": record["time"].isoformat(),
        "level": record["level"].name,
        "message": record["message"],
        "module": record["name"],
        **record["extra"],
    }
    if record["exception"] is not None:
        line["exception"] = f"{record['exception'].type.__name__}: {record['exception'].value}"
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
    # No filter at all unless one is asked for: it would run on every record.
    keep = None if key_changes or settings.level.upper() == "DEBUG" else _without_key_changes

    as_json = settings.format == "json" or (settings.format == "auto" and not sys.stderr.isatty())
    if as_json:
        # The sink builds its line from the record: "{message}" spares loguru formatting a
        # default line (time, level, caller) for every record that is never written.
        logger.add(_json_sink, level=settings.level.upper(), format="{message}", backtrace=False, diagnose=False,
                   filter=keep)
    else:
        logger.add(
            sys.stderr,
            level=settings.level.upper(),
            format="<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> {message}",
            backtrace=False,
            diagnose=False,
            filter=keep,
        )
