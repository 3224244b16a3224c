"""Request ids: the coordinator's plain token is taken; anything else gets a fresh one of 32 hex digits."""

from __future__ import annotations

import re

from aiohttp.test_utils import make_mocked_request

from exporter.sources.api import REQUEST_ID_HEADER, request_id_of


def test_a_plain_token_from_the_coordinator_is_kept() -> None:
    assert request_id_of(make_mocked_request("POST", "/", headers={REQUEST_ID_HEADER: "coord-42.a:b"})) == "coord-42.a:b"


def test_generated_ids_are_32_hex_digits_and_never_repeat() -> None:
    forged = make_mocked_request("POST", "/", headers={REQUEST_ID_HEADER: "a b\r\nX-Evil: 1"})
    ids = [request_id_of(forged), *(request_id_of(make_mocked_request("POST", "/")) for _ in range(10_000))]
    assert all(re.fullmatch("[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
