"""Who may push: the bearer token, Backend.AI's `X-BackendAI-Token`, and (optionally) HS256 JWTs.

Accepted, each compared in constant time, before the body is read:
- `Authorization: Bearer <token>`;
- `X-BackendAI-Token: <token>`, `X-BackendAI-Token: Bearer <token>` or `X-BackendAI-Token: BackendAI <token>`
  (what every published Backend.AI AppProxy client sends);
- with `api.jwt_secret_file`: `Authorization: Bearer <JWT>` signed HS256 with that secret, `exp`
  honoured; `alg: none` and every other algorithm are refused.
Every failure is the same 401 body: nothing tells which check failed.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

import jwt

from ..errors import Unauthorized

_BACKENDAI_PREFIXES = ("Bearer ", "BackendAI ")


class Authenticator:
    """Checks request headers; `token` None (and no JWT secret) means every request is accepted."""

    def __init__(self, token: str | None, jwt_secret: str | None = None) -> None:
        self._token = token.encode() if token is not None else None
        self._jwt_secret = jwt_secret

    @property
    def open(self) -> bool:
        """True when no credential is configured (loopback-only deployments)."""
        return self._token is None and self._jwt_secret is None

    def check(self, headers: Mapping[str, str]) -> None:
        """Raise Unauthorized unless `headers` carry an accepted credential."""
        if self.open:
            return
        backendai = headers.get("X-BackendAI-Token")
        if backendai is not None and (self._matches(backendai) or self._matches(_strip_prefix(backendai))):
            return
        scheme, _, given = headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and given.strip() and (self._matches(given.strip()) or self._valid_jwt(given.strip())):
            return
        raise Unauthorized("missing or wrong credentials")

    def _matches(self, given: str) -> bool:
        return self._token is not None and hmac.compare_digest(given.encode(), self._token)

    def _valid_jwt(self, given: str) -> bool:
        if self._jwt_secret is None:
            return False
        try:
            jwt.decode(given, self._jwt_secret, algorithms=["HS256"])
        except jwt.PyJWTError:
            return False
        return True


def _strip_prefix(value: str) -> str:
    for prefix in _BACKENDAI_PREFIXES:
        if value.startswith(prefix):
            return value[len(prefix) :]
    return value
