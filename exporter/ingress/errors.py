"""Field errors as the push API and ingress files report them."""

from __future__ import annotations

from pydantic import ValidationError


def field_errors(error: ValidationError) -> list[dict[str, str]]:
    """Every field error as `{"loc": "ingresses.0.hosts.1", "msg": ...}`; input values are never echoed."""
    out = []
    for item in error.errors(include_input=False, include_url=False):
        loc = ".".join(str(p) for p in item["loc"])
        msg = item["msg"].removeprefix("Value error, ")
        out.append({"loc": loc, "msg": msg})
    return out
