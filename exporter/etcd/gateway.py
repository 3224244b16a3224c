"""The HTTP side of etcd's v3 JSON gateway: endpoints and failover, TLS, auth tokens, reachability.

`EtcdClient` speaks etcd's operations over it; this module knows only how to reach an
endpoint, stay authenticated, and what etcd's answers (or silence) say about it.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from ..errors import EtcdError
from .reach import Evidence


@dataclass(frozen=True)
class EtcdSecurity:
    """TLS towards etcd (CA bundle, client certificate, server name) and username/password auth."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context, or None when nothing TLS-related is configured."""
        if not (self.ca_file or self.cert_file):
            return None
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


class Gateway:
    """Requests to the first gateway endpoint that answers, with a token when etcd wants one.

    Every request, watch line or failure updates `evidence`, shared with the other transport.
    """

    def __init__(
        self, endpoints: Sequence[str], timeout: float = 5.0, security: EtcdSecurity | None = None,
        evidence: Evidence | None = None,
    ) -> None:
        self._endpoints = list(endpoints)
        self._current = 0
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._security = security or EtcdSecurity()
        self._ssl = self._security.ssl_context()
        self._token: str | None = None
        # Auth tokens obtained so far (each authentication, first or renewal, adds one).
        self.tokens_issued = 0
        self.evidence = evidence or Evidence()

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to now (the next one is tried when it fails)."""
        return self._endpoints[self._current]

    @property
    def authenticated(self) -> bool:
        """True when requests carry a token for a username."""
        return bool(self._security.username)

    def next_endpoint(self) -> None:
        """Send the next requests to the next endpoint (this one failed)."""
        self._current = (self._current + 1) % len(self._endpoints)

    def answered(self) -> None:
        """etcd answered (a reply or a watch line)."""
        self.evidence.answered()

    def failed(self, error: EtcdError) -> EtcdError:
        """etcd could not be reached: recorded, and returned to raise."""
        return self.evidence.failed(error)

    def session(self) -> aiohttp.ClientSession:
        """The kept HTTP session (made again after `close`)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, ssl=self._ssl if self._ssl is not None else True),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            )
        return self._session

    def request_kwargs(self) -> dict[str, Any]:
        """Headers and TLS options every request carries (the auth token, the server name)."""
        kwargs: dict[str, Any] = {}
        if self._token is not None:
            kwargs["headers"] = {"Authorization": self._token}
        if self._security.server_name:
            kwargs["server_hostname"] = self._security.server_name
        return kwargs

    async def _authenticate(self) -> None:
        # Simple and JWT tokens expire (--auth-token-ttl): a new one is fetched whenever etcd
        # rejects the current one, so an idle exporter never loses its writes.
        sec = self._security
        self._token = None
        url = self._endpoints[self._current] + "/v3/auth/authenticate"
        try:
            async with self.session().post(url, json={"name": sec.username, "password": sec.password}, **self.request_kwargs()) as resp:
                payload = await resp.read()
                if resp.status != 200:
                    raise EtcdError(
                        f"etcd authentication failed for user {sec.username!r}: {error_text(payload, resp.status)}"
                    )
                self._token = json.loads(payload)["token"]
                self.tokens_issued += 1
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _connection_error(url, exc) from None

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(self, path: str, body: dict[str, Any] | bytes) -> dict[str, Any]:
        """POST `body` to `path` of the first endpoint that answers; the decoded JSON reply."""
        last: EtcdError | None = None
        reauthenticated = False
        attempt = 0
        while attempt < len(self._endpoints):
            url = self._endpoints[self._current] + path
            try:
                if self._security.username and self._token is None:
                    await self._authenticate()
                kwargs = self.request_kwargs()
                if isinstance(body, bytes):
                    kwargs["headers"] = {**kwargs.get("headers", {}), "Content-Type": "application/json"}
                    kwargs["data"] = body
                else:
                    kwargs["json"] = body
                async with self.session().post(url, **kwargs) as resp:
                    payload = await resp.read()
                    if resp.status != 200:
                        error = EtcdError(error_text(payload, resp.status), status=resp.status)
                        if self._security.username and not reauthenticated and _token_rejected(resp.status, payload):
                            reauthenticated = True
                            self._token = None
                            continue
                        # 503 is gRPC's Unavailable (no leader, member stopping): as good as unreachable.
                        raise self.failed(error) if resp.status == 503 else error
                    result: dict[str, Any] = orjson.loads(payload)
                    self.answered()
                    return result
            except (TimeoutError, aiohttp.ClientConnectionError, OSError) as exc:
                last = _connection_error(url, exc)
                self.next_endpoint()
                attempt += 1
        assert last is not None
        raise self.failed(last)


def _token_rejected(status: int, payload: bytes) -> bool:
    text = payload.decode(errors="replace").lower()
    return status == 401 or "invalid auth token" in text or ("token" in text and "expired" in text)


def _connection_error(url: str, exc: BaseException) -> EtcdError:
    """An unreachable etcd, with the TLS cause named when there is one."""
    text = str(exc)
    if isinstance(exc, aiohttp.ClientConnectorCertificateError) or "CERTIFICATE_VERIFY_FAILED" in text:
        cause = "TLS verification of etcd's certificate failed (wrong CA bundle or server name?)"
    elif "certificate required" in text.lower() or "bad certificate" in text.lower() or "unknown ca" in text.lower():
        cause = "etcd rejected the TLS handshake (client certificate missing or not signed by etcd's CA)"
    else:
        cause = f"unreachable: {type(exc).__name__} {text}".strip()
    return EtcdError(f"etcd at {url} {cause}", unavailable=True)


def error_text(payload: bytes, status: int) -> str:
    try:
        data = json.loads(payload)
        message = data.get("message") or data.get("error") or payload.decode(errors="replace")
    except ValueError:
        message = payload.decode(errors="replace")
    return f"etcd answered HTTP {status}: {str(message)[:300]}"
