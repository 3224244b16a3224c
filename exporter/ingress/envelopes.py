"""The envelopes ingresses travel in: an ingress file, the push API's upsert and remove bodies."""

from __future__ import annotations

from pydantic import Field, field_validator

from ..keys import IngressRef
from .bounds import MAX_INGRESSES_PER_REQUEST
from .core import Ingress
from .values import Authority, DnsLabel, Integer, Strict


class IngressFile(Strict):
    """The top-level shape of an ingress file (bounded by `sources.max_file_bytes`, not by a count)."""

    ingresses: list[Ingress]

    @field_validator("ingresses")
    @classmethod
    def _unique(cls, value: list[Ingress]) -> list[Ingress]:
        seen: set[IngressRef] = set()
        for ingress in value:
            if ingress.key in seen:
                raise ValueError(f"ingress {ingress.authority}/{ingress.id} appears more than once")
            seen.add(ingress.key)
        return value


class UpsertRequest(IngressFile):
    """The body of `POST /v2/ingress/upsert`."""

    ingresses: list[Ingress] = Field(max_length=MAX_INGRESSES_PER_REQUEST)


class RemoveItem(Strict):
    """What a remove request names; without `revision` whatever is stored is removed."""

    authority: Authority
    id: DnsLabel
    revision: Integer | None = Field(default=None, ge=0, le=2**63 - 1)


class RemoveRequest(Strict):
    """The body of `POST /v2/ingress/remove`."""

    ingresses: list[RemoveItem] = Field(max_length=MAX_INGRESSES_PER_REQUEST)
