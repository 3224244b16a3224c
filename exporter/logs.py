"""Logging setup: loguru, human lines on a TTY and JSON lines otherwise (or as configured)."""

from __future__ import annotations

import sys

from loguru import logger

from .config import LogSettings


def setup_logging(settings: LogSettings) -> None:
    """Replace loguru's default sink with the configured one on stderr."""
    logger.remove()
    as_json = settings.format == "json" or (settings.format == "auto" and not sys.stderr.isatty())
    if as_json:
        logger.add(sys.stderr, level=settings.level.upper(), serialize=True, backtrace=False, diagnose=False)
    else:
        logger.add(
            sys.stderr,
            level=settings.level.upper(),
            format="<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> {message}",
            backtrace=False,
            diagnose=False,
        )
