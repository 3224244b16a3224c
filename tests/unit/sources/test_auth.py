"""Push API credentials: the bearer token, Backend.AI's X-BackendAI-Token forms, HS256 JWTs."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable

import jwt
import pytest

from exporter.errors import Unauthorized
from exporter.sources.auth import Authenticator

SECRET, JWT_SECRET = "s3cret-token", "jwt-secret-value-long-enough-for-hs512-signatures-0123456789abcdef"
AUTH = Authenticator(SECRET, JWT_SECRET)


def _jwt(secret: str = JWT_SECRET, algorithm: str = "HS256", **claims: object) -> str:
    return jwt.encode({"sub": "coordinator", **claims}, secret, algorithm=algorithm)


@pytest.mark.parametrize(
    "headers",
    [
        lambda: {"Authorization": f"Bearer {SECRET}"},
        lambda: {"X-BackendAI-Token": SECRET},
        lambda: {"X-BackendAI-Token": f"Bearer {SECRET}"},
        lambda: {"X-BackendAI-Token": f"BackendAI {SECRET}"},
        lambda: {"Authorization": f"Bearer {_jwt()}"},
        # Made when the test runs: a token made at collection would expire while earlier tests run.
        lambda: {"Authorization": f"Bearer {_jwt(exp=int(time.time()) + 60)}"},
    ],
    ids=["bearer", "backendai-raw", "backendai-bearer", "backendai-backendai", "jwt", "jwt-not-expired"],
)
def test_every_accepted_form(headers: Callable[[], dict[str, str]]) -> None:
    AUTH.check(headers())


def _none_alg_token() -> str:
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part({'sub': 'coordinator'})}."


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {SECRET}"},
        {"X-BackendAI-Token": "wrong"},
        {"X-BackendAI-Token": f"Token {SECRET}"},
        {"X-BackendAI-Token": f"bearer{SECRET}"},
        {"Authorization": f"Bearer {_jwt(secret='another-secret-that-is-long-enough-for-hs256')}"},
        {"Authorization": f"Bearer {_jwt(exp=int(time.time()) - 10)}"},
        {"Authorization": f"Bearer {_none_alg_token()}"},
        {"Authorization": f"Bearer {_jwt(algorithm='HS512')}"},
        {"X-BackendAI-Token": _jwt()},
    ],
    ids=["none", "wrong-token", "wrong-scheme", "backendai-wrong", "backendai-wrong-prefix", "backendai-glued",
         "jwt-wrong-secret", "jwt-expired", "jwt-alg-none", "jwt-hs512", "jwt-in-backendai-header"],
)
def test_every_wrong_form_is_the_same_401(headers: dict[str, str]) -> None:
    with pytest.raises(Unauthorized) as info:
        AUTH.check(headers)
    assert info.value.title == "missing or wrong credentials" and info.value.data == {}


def test_jwts_are_refused_without_a_jwt_secret() -> None:
    with pytest.raises(Unauthorized):
        Authenticator(SECRET).check({"Authorization": f"Bearer {_jwt()}"})
