"""The coordinator push API (the api-delivery worker contract), on aiohttp.

`POST /v2/ingress/upsert` and `POST /v2/ingress/remove` answer 204 only once every ingress
of the request is committed in etcd; `GET /v2/ingress` lists what is stored. The token is
checked before anything else is read; errors are `{"type", "title", "data"}` JSON and never
carry a stack trace, an input value or a secret.

Every request has an id: the coordinator's `X-BackendAI-RequestID` when it is a plain token,
else a generated one. It is echoed in the same response header, named in error bodies
(`data.request_id`), carried by every log line the request's handler writes, and each push
leaves one access line (method, route, status, duration, ingresses, request id).
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Protocol, TypeVar

from aiohttp import web
from loguru import logger
from pydantic import BaseModel, ValidationError

from ..errors import (
    BodyTooLarge,
    EtcdError,
    EtcdUnavailable,
    ExporterError,
    NotServedInTime,
    StaleRevisionError,
    TemplateError,
    Unauthorized,
    UnsupportedMediaType,
    ValidationFailed,
)
from ..ingress import RemoveRequest, UpsertRequest, field_errors
from ..keys import IngressRef
from ..logs import info_line
from ..metrics import Metrics
from ..store.records import Record, RecordStore, Removal
from ..tracing.hooks import NO_TRACING, PushSpan, Tracing
from ..traefik.serving import Serving
from .auth import Authenticator
from .files import RecordSink

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)
REQUEST_ID_HEADER = "X-BackendAI-RequestID"
# A coordinator's id taken as it is: short, and nothing that could forge a log line or a header.
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z")
# How many ingresses the request being answered carries (its access line says): set by the handler, in the request's task.
_INGRESSES: ContextVar[int] = ContextVar("ingresses", default=0)

# The one place errors become HTTP statuses (docs/api.md); the most specific class wins.
HTTP_STATUS: dict[type[ExporterError], int] = {
    ValidationFailed: 400,
    TemplateError: 400,
    Unauthorized: 401,
    StaleRevisionError: 409,
    BodyTooLarge: 413,
    UnsupportedMediaType: 415,
    EtcdError: 503,
    NotServedInTime: 504,
}


class IngressSink(RecordSink, Protocol):
    """What the push API drives: the reconciler (it also lists what is stored)."""

    store: RecordStore


def status_of(error: ExporterError) -> int:
    """The HTTP status of an error (500 for anything not in the table)."""
    for cls in type(error).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500


def is_loopback(listen: str) -> bool:
    """True when a host:port listens on a loopback address only."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def error_response(error: ExporterError, request_id: str | None = None) -> web.Response:
    """The JSON error body and status of one error (naming the request id when there is one)."""
    body = error.to_json()
    if request_id is not None:
        body["data"] = {**body["data"], "request_id": request_id}
    return web.json_response(body, status=status_of(error))


# A generated request id only has to be unique: a random half per process and a counter (32 hex
# digits), rather than 16 bytes from the OS per request, a system call each (2 % of a push's CPU).
_ID_PREFIX = secrets.token_hex(8)
_ID_COUNTER = itertools.count()


def request_id_of(request: web.Request) -> str:
    """The coordinator's request id when it is a plain token (at most 128 of `A-Za-z0-9._:-`), else a new one."""
    given = request.headers.get(REQUEST_ID_HEADER, "")
    return given if _REQUEST_ID_RE.match(given) else f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


async def read_body(request: web.Request, model: type[M], max_body_bytes: int) -> M:
    """The request's JSON body validated as `model`; every failure is a ValidationFailed naming the fields."""
    if request.content_type != "application/json":
        raise UnsupportedMediaType("the body must be JSON (Content-Type: application/json)")
    if request.content_length is not None and request.content_length > max_body_bytes:
        raise BodyTooLarge(f"request body is larger than {max_body_bytes} bytes")
    raw = await request.read()
    try:
        return model.model_validate_json(raw)  # parsed and validated in one pass
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors(include_input=False, include_url=False)):
            raise ValidationFailed("the body is not valid JSON", {"errors": [{"loc": "", "msg": "invalid JSON"}]}) from None
        errors = field_errors(exc)
        raise ValidationFailed(f"{len(errors)} invalid field(s) in the request", {"errors": errors}) from None
    except RecursionError:
        raise ValidationFailed("the body is nested too deeply", {"errors": [{"loc": "", "msg": "too deep"}]}) from None


class PushApi:
    """The handlers of the push API over one sink; `auth` is checked before anything else of a request is read.

    `serving` adds each stored ingress's status to the list and makes `?wait=served` work.
    """

    def __init__(
        self, sink: IngressSink, *, auth: Authenticator, max_body_bytes: int, ready: Callable[[], bool],
        serving: Serving | None = None, refused: Callable[[ExporterError], None] | None = None, metrics: Metrics | None = None,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        """`refused`: told of every request answered 400 or 409 (the status page's events); `tracing`: a span per push."""
        self._sink = sink
        self._tracing = tracing
        self._refused = refused
        self._auth = auth
        self._max_body_bytes = max_body_bytes
        self._ready = ready
        self._serving = serving
        self._requests = (metrics or Metrics()).api_requests

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(middlewares=[self._guard], client_max_size=self._max_body_bytes)
        app.router.add_post("/v2/ingress/upsert", self.upsert)
        app.router.add_post("/v2/ingress/remove", self.remove)
        app.router.add_get("/v2/ingress", self.list_ingresses)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unknown"
        request_id = request_id_of(request)
        started = time.perf_counter()
        counted = _INGRESSES.set(0)
        traced = self._tracing.enabled and request.method == "POST"
        with (
            logger.contextualize(request_id=request_id),
            self._tracing.push(request.method, route, request.headers, request_id, request.query.get("wait") == "served")
            if traced else contextlib.nullcontext(Tracing.NO_SPAN) as span,
        ):
            response = await self._answer(request, handler, request_id, span)
            response.headers[REQUEST_ID_HEADER] = request_id
            self._requests.labels(route, str(response.status)).inc()
            if request.method == "POST":
                ingresses = _INGRESSES.get()
                span.finish(response.status, ingresses)
                info_line(
                    f"push {request.method} {route} {response.status} {(time.perf_counter() - started) * 1000:.1f}ms "
                    f"ingresses={ingresses} request_id={request_id}",
                    request_id=request_id, route=route, status=response.status, ingresses=ingresses,
                )
        _INGRESSES.reset(counted)
        return response

    async def _answer(self, request: web.Request, handler: _Handler, request_id: str, span: PushSpan) -> web.StreamResponse:
        """The handler's response, or the error response of what it raised (never a stack trace)."""
        try:
            self._auth.check(request.headers)
            return await handler(request)
        except ExporterError as exc:
            span.refused(exc.type_name)
            response = error_response(exc, request_id)
            if self._refused is not None and response.status in (400, 409):
                self._refused(exc)
            return response
        except web.HTTPException as exc:
            span.refused(BodyTooLarge.__name__ if exc.status == 413 else type(exc).__name__)
            if exc.status == 413:
                return error_response(BodyTooLarge(f"request body is larger than {self._max_body_bytes} bytes"), request_id)
            answer = web.json_response(
                {"type": type(exc).__name__, "title": exc.reason, "data": {"request_id": request_id}}, status=exc.status
            )
            # A 405 names the methods the path takes (RFC 9110).
            if "Allow" in exc.headers:
                answer.headers["Allow"] = exc.headers["Allow"]
            return answer
        except Exception:  # noqa: BLE001 - never a stack trace in a body
            span.refused("InternalError")
            logger.exception("push API {} {} failed", request.method, request.path)
            return web.json_response(
                {"type": "InternalError", "title": "internal error; see the exporter log", "data": {"request_id": request_id}},
                status=500,
            )

    def _check_ready(self) -> None:
        if not self._ready():
            raise EtcdUnavailable("etcd is unreachable or not synced yet; nothing was written")

    def _waiter(self, request: web.Request) -> Serving | None:
        """What `?wait=served` waits with (None without the parameter); checked before anything is written."""
        wait = request.query.get("wait")
        if wait is None:
            return None
        if wait != "served":
            raise ValidationFailed("wait: the only value is served", {"errors": [{"loc": "wait", "msg": "must be served"}]})
        if self._serving is None or not self._serving.can_wait:
            raise ValidationFailed(
                "wait=served needs traefik.api_url: this exporter does not know what Traefik serves",
                {"errors": [{"loc": "wait", "msg": "traefik.api_url is not configured"}]},
            )
        return self._serving

    async def upsert(self, request: web.Request) -> web.Response:
        """`POST /v2/ingress/upsert`: 204 once every ingress of the body is committed (`?wait=served`: and served)."""
        waiter = self._waiter(request)
        body = await read_body(request, UpsertRequest, self._max_body_bytes)
        _INGRESSES.set(len(body.ingresses))
        self._check_ready()
        await self._sink.submit([Record.of(ingress) for ingress in body.ingresses])
        if waiter is not None:
            await waiter.wait([ingress.key for ingress in body.ingresses])
        return web.Response(status=204)

    async def remove(self, request: web.Request) -> web.Response:
        """`POST /v2/ingress/remove`: 204 once every removal is committed (`?wait=served`: and no longer served)."""
        waiter = self._waiter(request)
        body = await read_body(request, RemoveRequest, self._max_body_bytes)
        _INGRESSES.set(len(body.ingresses))
        self._check_ready()
        removals = [Removal(IngressRef(r.authority, r.id), r.revision) for r in body.ingresses]
        await self._sink.submit([], removals)
        if waiter is not None:
            await waiter.wait([r.ref for r in removals])
        return web.Response(status=204)

    async def list_ingresses(self, request: web.Request) -> web.Response:
        """`GET /v2/ingress[?authority=]`: every stored ingress with its revision and status."""
        self._check_ready()
        records = self._sink.store.by_authority(request.query.get("authority"))
        serving = self._serving
        entries = [
            {**r.ingress.model_dump(mode="json"), **({"status": serving.status(r)} if serving is not None else {})}
            for r in records
        ]
        return web.json_response({"ingresses": entries})


def push_api_app(
    sink: IngressSink, *, token: str | None, max_body_bytes: int, ready: Callable[[], bool] = lambda: True,
    serving: Serving | None = None, jwt_secret: str | None = None, refused: Callable[[ExporterError], None] | None = None,
    metrics: Metrics | None = None, tracing: Tracing = NO_TRACING,
) -> web.Application:
    """The aiohttp application of the push API. No token and no JWT secret means unauthenticated (loopback only)."""
    auth = Authenticator(token, jwt_secret)
    return PushApi(sink, auth=auth, max_body_bytes=max_body_bytes, ready=ready, serving=serving, refused=refused,
                   metrics=metrics, tracing=tracing).app()
