"""Who may reach a route and what runs on it: the client IP strategy and the user's own middlewares."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, StrictStr, ValidationInfo, model_validator

from .bounds import MAX_ALLOWED_IPS
from .values import Cidr, Integer, Published, Strict, admitting, pattern

_MIDDLEWARE_REF = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}@[a-z0-9-]{1,63}$"
_MIDDLEWARE_REF_RE = pattern(_MIDDLEWARE_REF)


def _middleware_ref(value: str) -> str:
    if not _MIDDLEWARE_REF_RE.fullmatch(value):
        raise ValueError("must be <name>@<provider> (e.g. cors@file): [A-Za-z0-9_-] then '@' and a lowercase provider")
    return value


# A middleware of another provider, referenced by the router after the exporter's own.
MiddlewareRef = Annotated[StrictStr, AfterValidator(_middleware_ref), Published(pattern=_MIDDLEWARE_REF)]


class IpStrategy(Strict):
    """How the client IP is found behind load balancers: the `depth`-th address from the right of
    X-Forwarded-For, skipping `excluded_ips` (Traefik's ipAllowList.ipStrategy)."""

    depth: Annotated[Integer, Published(description="above 0: excluded_ips must be empty (Traefik ignores them then)")] = Field(
        default=0, ge=0, le=64
    )
    excluded_ips: list[Cidr] = Field(default_factory=list, max_length=MAX_ALLOWED_IPS)

    @model_validator(mode="after")
    def _one_of(self, info: ValidationInfo) -> IpStrategy:
        # Traefik's ipStrategy takes `depth` whenever it is above 0 and then ignores `excludedIPs`.
        if self.depth > 0 and self.excluded_ips and admitting(info):
            raise ValueError("give depth or excluded_ips, not both: with depth set, Traefik ignores excluded_ips")
        return self
