"""The active health check of an ingress (Backend.AI's `ModelHealthCheck`)."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, ConfigDict, Field

from .values import Integer, Strict, UrlPath


class HealthCheck(Strict):
    """Active health check, with Backend.AI `ModelHealthCheck` names, defaults and range.

    Every value `ModelHealthCheck` accepts is accepted (snake_case or its kebab-case aliases);
    edge values get the meanings documented in docs/ingress.md (`max_retries: 0` ejects on
    the first failure; an `interval` or `max_wait_time` below 0.1 s counts as 0.1 s).
    """

    model_config = ConfigDict(json_schema_extra=lambda schema, _cls: _publish_aliases(schema))

    enable: bool = False
    path: UrlPath = "/health"
    interval: float = Field(default=10.0, allow_inf_nan=False)
    max_retries: Integer = Field(default=10, validation_alias=AliasChoices("max_retries", "max-retries"))
    max_wait_time: float = Field(
        default=15.0, allow_inf_nan=False, validation_alias=AliasChoices("max_wait_time", "max-wait-time")
    )
    expected_status_code: Integer = Field(
        default=200, gt=100, validation_alias=AliasChoices("expected_status_code", "expected-status-code")
    )
    initial_delay: float = Field(
        default=60.0, ge=0, allow_inf_nan=False, validation_alias=AliasChoices("initial_delay", "initial-delay")
    )


_ALIASES = ("max-retries", "max-wait-time", "expected-status-code", "initial-delay")


def _publish_aliases(schema: dict[str, Any]) -> None:
    """Each kebab-case alias published beside its snake_case name, as the same value: one of the two, never both."""
    properties = schema["properties"]
    for alias in _ALIASES:
        name = alias.replace("-", "_")
        properties[alias] = {k: v for k, v in properties[name].items() if k != "default"}
    schema["dependentSchemas"] = {alias: {"not": {"required": [alias.replace("-", "_")]}} for alias in _ALIASES}
