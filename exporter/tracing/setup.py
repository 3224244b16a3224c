"""Tracing from the settings: off (nothing of OpenTelemetry imported), or spans exported over OTLP.

Where `otel.endpoint` and `otel.service_name` are left unset, the standard
`OTEL_EXPORTER_OTLP_ENDPOINT` and `OTEL_SERVICE_NAME` apply; `OTEL_RESOURCE_ATTRIBUTES` adds
to the resource (the settings' own attributes win).
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from loguru import logger

from .. import __version__
from ..config.sections import OtelSettings
from ..errors import ConfigError
from .hooks import NO_TRACING, Tracing

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

EXTRA = "traefik-etcd-exporter[otel]"
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+\Z")


def read_headers(path: Path) -> dict[str, str]:
    """The headers of `otel.headers_file`: `name=value` (or `name: value`) per line or comma-separated.

    A ConfigError names the file and the line, never a value.
    """
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"otel.headers_file: cannot read {path} ({type(exc).__name__})") from None
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        for item in line.split(","):
            if not item.strip() or item.lstrip().startswith("#"):
                continue
            name, sep, value = item.partition("=") if "=" in item else item.partition(":")
            name = name.strip()
            if not sep or not _HEADER_NAME.match(name) or not value.strip():
                raise ConfigError(f"otel.headers_file: line {number} of {path} is not name=value")
            headers[name.lower()] = value.strip()
    return headers


def endpoint_of(settings: OtelSettings) -> str:
    """Where spans go: the setting, else `OTEL_EXPORTER_OTLP_ENDPOINT`, else the default; for http/protobuf
    a base URL gets `/v1/traces` (as the OTLP specification says of the environment variable)."""
    endpoint = settings.endpoint
    if "endpoint" not in settings.model_fields_set and (env := os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        endpoint = env
    if settings.protocol == "http/protobuf" and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def start_tracing(settings: OtelSettings, instance_id: str) -> Tracing:
    """The tracing the settings describe; enabled without the extra installed is a ConfigError naming it."""
    if not settings.enabled:
        return NO_TRACING
    try:
        exporter = _exporter(settings)
        otel = importlib.import_module("exporter.tracing.otel")
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise ConfigError(
            f"otel.enabled needs the OpenTelemetry SDK and its OTLP exporters: pip install '{EXTRA}' ({exc.name} is missing)"
        ) from None
    resource = Resource.create({"service.version": __version__, "service.instance.id": instance_id})
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; without either it names an unknown service.
    if "service_name" in settings.model_fields_set or str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": settings.service_name}))
    provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)))
    processor = BatchSpanProcessor(
        exporter, max_queue_size=settings.max_queue_size, max_export_batch_size=settings.max_export_batch_size,
    )
    provider.add_span_processor(processor)
    otel.join_logs()
    logger.info("tracing: spans go to {} over {} (sampling {:g} of new traces)", endpoint_of(settings), settings.protocol,
                settings.sample_ratio)
    tracing: Tracing = otel.OtelTracing(provider, processor)
    return tracing


def _exporter(settings: OtelSettings) -> SpanExporter:
    """The OTLP exporter of the protocol (an ImportError without the extra)."""
    headers = read_headers(settings.headers_file) if settings.headers_file is not None else {}
    endpoint = endpoint_of(settings)
    if settings.protocol == "grpc":
        from .encoding import GrpcSpanExporter

        return GrpcSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"), headers=headers)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=endpoint, headers=headers)
