"""Settings: loaded once from `exporter.yaml` plus `EXPORTER_<SECTION>__<FIELD>` env, then passed down."""

from __future__ import annotations

import re
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from .ingress import validate_entrypoint
from .keys import KeyLayout

_LISTEN_RE = re.compile(r"^[^\s:]+:\d{1,5}\Z")
# The YAML file of the Settings being built (settings_customise_sources is a classmethod).
_CONFIG_FILE: ContextVar[Path | None] = ContextVar("_CONFIG_FILE", default=None)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EtcdSettings(_Section):
    """How to reach etcd (through its v3 JSON gateway)."""

    endpoints: list[str] = Field(
        default=["http://127.0.0.1:2379"], min_length=1, description="etcd client URLs (v3 JSON gateway), tried in order"
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
    ca_file: Path | None = Field(default=None, description="CA bundle that signed etcd's server certificate (https endpoints)")
    cert_file: Path | None = Field(default=None, description="client certificate for etcd --client-cert-auth")
    key_file: Path | None = Field(default=None, description="its private key")
    server_name: str | None = Field(default=None, description="name to verify in etcd's certificate (default: the endpoint host)")
    username: str | None = Field(default=None, description="etcd user (auth enabled)")
    password: SecretStr | None = Field(default=None, description="its password (use EXPORTER_ETCD__PASSWORD)")
    password_file: Path | None = Field(default=None, description="file holding the password")

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

    files: list[str] = Field(
        default_factory=list, description="globs of ingress YAML files (relative to the config file), hot-reloaded"
    )
    max_file_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="larger ingress files are refused (no bound on the count of ingresses)"
    )


class TemplatesSettings(_Section):
    """Traefik config templates; `dir` overrides the built-in ones file by file."""

    dir: Path | None = Field(default=None, description="directory whose *.json.j2 files override the built-in templates")


class _Server(_Section):
    """An HTTP(S) server: where it listens and, optionally, its TLS certificate."""

    listen: str
    tls_cert_file: Path | None = Field(default=None, description="serve HTTPS with this PEM certificate (chain)")
    tls_key_file: Path | None = Field(default=None, description="and this private key")

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
    token_file: Path | None = Field(default=None, description="file holding the bearer token")
    token: SecretStr | None = Field(default=None, description="the bearer token itself (use EXPORTER_API__TOKEN)")
    jwt_secret_file: Path | None = Field(
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
        default=86400.0, ge=0, description="seconds a removed ingress's tombstone refuses older upserts"
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
    password_file: Path | None = Field(default=None, description="file holding that user's password")
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
    password_file: Path | None = Field(default=None, description="file holding the Redis password")
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

    access_log: Path | None = Field(
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
    passive: PassiveSettings = Field(default_factory=PassiveSettings)
    notify_url: str | None = Field(
        default=None, description="URL the leader POSTs every routed/not-routed transition of a node to (unset: none)"
    )
    notify_token_file: Path | None = Field(
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
    ca_file_dirs: list[Path] = Field(
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

    cert_file: Path | None = Field(default=None, description="PEM certificate written as Traefik's default certificate")
    key_file: Path | None = Field(default=None, description="its PEM private key (both set, or a certificate is generated)")


class LogSettings(_Section):
    """Log format and level."""

    format: Literal["auto", "human", "json"] = Field(
        default="auto", description="auto: human on a TTY, JSON lines otherwise"
    )
    level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")


class Settings(BaseSettings):
    """The whole configuration of one exporter."""

    model_config = SettingsConfigDict(
        env_prefix="EXPORTER_", env_nested_delimiter="__", extra="forbid"
    )

    etcd: EtcdSettings = Field(default_factory=EtcdSettings)
    root_key: str = Field(
        default="traefik/worker_{authority}", description="Traefik rootKey per authority ({authority} placeholder)"
    )
    records_prefix: str = Field(
        default="traefik-etcd-exporter/records", description="where desired ingress records are stored in etcd"
    )
    default_entrypoints: list[str] = Field(
        default=["web"], min_length=1, max_length=16, description="entrypoints of ingresses that name none"
    )
    sources: SourcesSettings = Field(default_factory=SourcesSettings)
    templates: TemplatesSettings = Field(default_factory=TemplatesSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    control: ControlSettings = Field(default_factory=ControlSettings)
    writer: WriterSettings = Field(default_factory=WriterSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    leader: LeaderSettings = Field(default_factory=LeaderSettings)
    tls: TlsSettings = Field(default_factory=TlsSettings)
    traefik: TraefikSettings = Field(default_factory=TraefikSettings)
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    discovery: DiscoverySettings = Field(default_factory=DiscoverySettings)
    log: LogSettings = Field(default_factory=LogSettings)

    @field_validator("root_key")
    @classmethod
    def _root_key(cls, value: str) -> str:
        bare = value.replace("{authority}", "")
        if not value or value.startswith("/") or value.endswith("/") or "//" in value:
            raise ValueError("must be a key path without leading, trailing or double '/'")
        if not re.match(r"^[A-Za-z0-9_./-]+\Z", bare):
            raise ValueError("only [A-Za-z0-9_./-] and the placeholder {authority} are allowed")
        return value

    @field_validator("records_prefix")
    @classmethod
    def _records_prefix(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*\Z", value):
            raise ValueError("must be a key path of [A-Za-z0-9_.-] segments without leading or trailing '/'")
        return value

    @field_validator("default_entrypoints")
    @classmethod
    def _entrypoints(cls, value: list[str]) -> list[str]:
        return [validate_entrypoint(name) for name in value]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Env overrides the file; explicit init kwargs override both.
        yaml_file = _CONFIG_FILE.get()
        if yaml_file is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))

    def layout(self) -> KeyLayout:
        """Every key name the exporter uses, from these settings (sidecars sharing the records share a leader)."""
        return KeyLayout(
            root_key=self.root_key,
            records_prefix=self.records_prefix,
            health_prefix=self.health.prefix,
            election_key=self.leader.key,
        )

    def etcd_password(self) -> str | None:
        """The etcd password from `etcd.password` (env) or `etcd.password_file`."""
        return _secret(self.etcd.password, self.etcd.password_file, "etcd.password_file")

    def traefik_password(self) -> str | None:
        """The password of Traefik's API (`traefik.password_file`)."""
        return _secret(None, self.traefik.password_file, "traefik.password_file")

    def discovery_password(self) -> str | None:
        """The discovery Redis password (`discovery.password_file`)."""
        return _secret(None, self.discovery.password_file, "discovery.password_file")

    def api_jwt_secret(self) -> str | None:
        """The secret JWTs are verified with (`api.jwt_secret_file`)."""
        return _secret(None, self.api.jwt_secret_file, "api.jwt_secret_file")

    def notify_token(self) -> str | None:
        """The bearer token of health notifications (`health.notify_token_file`)."""
        return _secret(None, self.health.notify_token_file, "health.notify_token_file")

    def api_token(self) -> str | None:
        """The push API token from `api.token` (env) or `api.token_file`."""
        return _secret(self.api.token, self.api.token_file, "api.token_file")


def _secret(value: SecretStr | None, path: Path | None, field: str) -> str | None:
    if value is not None:
        return value.get_secret_value()
    return read_secret(path, field) if path is not None else None


def read_secret(path: Path, field: str) -> str | None:
    """A secret from a file (stripped; None when empty); a ConfigError naming the field if unreadable."""
    from .errors import ConfigError

    try:
        return path.read_text().strip() or None
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read {path}: {exc.strerror}") from None


def load_settings(path: Path | None, **overrides: Any) -> Settings:
    """Load settings from `path` (YAML) and the environment; relative paths resolve against the file."""
    if path is None:
        settings = _build(**overrides)
        base = Path.cwd()
    else:
        if not path.is_file():
            from .errors import ConfigError

            raise ConfigError(f"config file {path} does not exist")
        token = _CONFIG_FILE.set(path)
        try:
            settings = _build(**overrides)
        finally:
            _CONFIG_FILE.reset(token)
        base = path.resolve().parent
    return _resolve_paths(settings, base)


def _build(**overrides: Any) -> Settings:
    from .errors import ConfigError
    from .ingress import field_errors

    try:
        return Settings(**overrides)
    except ValidationError as exc:
        errors = field_errors(exc)
        detail = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors)
        raise ConfigError(f"invalid configuration: {detail}", {"errors": errors}) from None
    except ValueError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None


def _resolve_paths(settings: Settings, base: Path) -> Settings:
    def rel(p: Path | None) -> Path | None:
        return None if p is None or p.is_absolute() else base / p

    settings.sources.files = [f if Path(f).is_absolute() else str(base / f) for f in settings.sources.files]
    if settings.templates.dir is not None:
        settings.templates.dir = rel(settings.templates.dir) or settings.templates.dir
    if settings.api.token_file is not None:
        settings.api.token_file = rel(settings.api.token_file) or settings.api.token_file
    settings.api.jwt_secret_file = rel(settings.api.jwt_secret_file) or settings.api.jwt_secret_file
    for name in ("ca_file", "cert_file", "key_file", "password_file"):
        value = getattr(settings.etcd, name)
        setattr(settings.etcd, name, rel(value) or value)
    for section in (settings.api, settings.control):
        section.tls_cert_file = rel(section.tls_cert_file) or section.tls_cert_file
        section.tls_key_file = rel(section.tls_key_file) or section.tls_key_file
    settings.traefik.password_file = rel(settings.traefik.password_file) or settings.traefik.password_file
    settings.discovery.password_file = rel(settings.discovery.password_file) or settings.discovery.password_file
    settings.health.notify_token_file = rel(settings.health.notify_token_file) or settings.health.notify_token_file
    settings.health.passive.access_log = rel(settings.health.passive.access_log) or settings.health.passive.access_log
    settings.tls.cert_file = rel(settings.tls.cert_file) or settings.tls.cert_file
    settings.tls.key_file = rel(settings.tls.key_file) or settings.tls.key_file
    return settings


def reference_markdown() -> str:
    """The configuration reference (docs/configuration.md), generated from the models above."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from `exporter/config.py` by `traefik-etcd-exporter config-reference`; a test",
        "fails when this file is stale. Every field can be set in `exporter.yaml` or from the",
        "environment as `EXPORTER_<SECTION>__<FIELD>` (lists and objects as JSON); the environment",
        "wins. Relative paths are relative to the config file.",
        "",
        "| field | env | default | meaning |",
        "|---|---|---|---|",
    ]

    def default_of(info: Any) -> str:
        if info.default_factory is not None:
            value = info.default_factory()
            return "" if isinstance(value, BaseModel) else f"`{value!r}`"
        return f"`{info.default!r}`" if info.default is not None else ""

    def rows(model: type[BaseModel], path: list[str]) -> None:
        for name, info in model.model_fields.items():
            annotation = info.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                rows(annotation, [*path, name])
                continue
            field, env = ".".join([*path, name]), "EXPORTER_" + "__".join(p.upper() for p in [*path, name])
            lines.append(f"| `{field}` | `{env}` | {default_of(info)} | {info.description or ''} |")

    rows(Settings, [])
    return "\n".join(lines) + "\n"
