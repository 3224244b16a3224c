"""Logging setup: loguru, human lines on a TTY and JSON lines otherwise (or as configured).

A JSON line is `{"time", "level", "message", ...}` plus the fields bound to the record
(a transaction line carries `revision` and `ingresses`). Secrets are never passed to the
logger in the first place: tokens and passwords are not logged, plan values are redacted.
"""

from __future__ import annotations

import json
import sys
from typing import Any

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
    sys.stderr.write(json.dumps(line, default=str) + "\n")


def setup_logging(settings: LogSettings) -> None:
    """Replace loguru's default sink with the configured one on stderr."""
    logger.remove()
    as_json = settings.format == "json" or (settings.format == "auto" and not sys.stderr.isatty())
    if as_json:
        logger.add(_json_sink, level=settings.level.upper(), backtrace=False, diagnose=False)
    else:
        logger.add(
            sys.stderr,
            level=settings.level.upper(),
            format="<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> {message}",
            backtrace=False,
            diagnose=False,
        )
