"""Requests aiohttp refuses before any handler runs: logged through the daemon's logger, and counted.

aiohttp's parser (bad header bytes, a bad request line, an oversized header) answers such a
request itself and reports it on its own standard-library logger, with a traceback: lines that
are not the daemon's, in a log that monitoring parses line by line. The servers are given a
logger whose one handler writes a client's malformed request as one WARNING line (its status
and the parser's reason, never the bytes it refused) and anything else as an ERROR with its
exception, both through loguru; `counted` (the push API's request counter) counts each under
the route `malformed`.
"""

from __future__ import annotations

import logging
import re

from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError
from loguru import logger
from prometheus_client import Counter

MALFORMED_ROUTE = "malformed"
# Where the parser's reason starts quoting the bytes it refused (`...: b'X-Token: a\x00b'`), to its end.
_QUOTED = re.compile(r"[:.\s]*(b['\"].*)?$")


class _ToDaemonLog(logging.Handler):
    def __init__(self, server: str, counted: Counter | None) -> None:
        super().__init__(logging.DEBUG)
        self._server = server
        self._counted = counted

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else "unknown"
        if isinstance(error, HttpProcessingError) and 400 <= (error.code or 400) < 500:
            status = error.code or 400
            if self._counted is not None:
                self._counted.labels(MALFORMED_ROUTE, str(status)).inc()
            # The parser's reason without the bytes it quotes (a header's value may be a credential).
            reason = _QUOTED.sub("", (error.message or type(error).__name__).strip().splitlines()[0])
            # Non-HTTP traffic on the port (a TLS hello, a scanner) is common noise: DEBUG, as aiohttp has it.
            level = "DEBUG" if isinstance(error, BadHttpMethod) else "WARNING"
            logger.bind(status=status, remote=str(remote)).log(
                level, "{} refused a malformed request from {} with {}: {}", self._server, remote, status, reason
            )
            return
        logger.opt(exception=record.exc_info).error("{}: {}", self._server, record.getMessage())


def server_logger(server: str, counted: Counter | None = None) -> logging.Logger:
    """The logger an aiohttp server of the daemon reports its own errors to (named `server`)."""
    log = logging.getLogger(f"exporter.aiohttp.{server.replace(' ', '-')}")
    log.handlers = [_ToDaemonLog(server, counted)]
    log.setLevel(logging.DEBUG)
    log.propagate = False
    return log
