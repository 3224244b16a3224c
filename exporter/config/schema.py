"""The settings' schema: every section and field, its default, bounds and description.

Loading (the YAML file and the environment) is config/load.py; paths relative to the config
file are marked with `ConfigPath` and resolved by one walk (config/paths.py); secrets are read
through `SecretSource` (config/secrets.py).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from ..ingress import validate_entrypoint
from ..keys import KeyLayout
from .secrets import SecretSource
from .sections import (
    ApiSettings,
    ControlSettings,
    DiscoverySettings,
    EmbeddedSettings,
    EtcdSettings,
    HealthSettings,
    LeaderSettings,
    LogSettings,
    OtelSettings,
    SourcesSettings,
    TemplatesSettings,
    TlsSettings,
    TraefikSettings,
    UpstreamSettings,
    WriterSettings,
)

SecretName = Literal["etcd.password", "traefik.password", "discovery.password", "api.jwt_secret", "health.notify_token", "api.token"]


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
    embedded: EmbeddedSettings = Field(default_factory=EmbeddedSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    otel: OtelSettings = Field(default_factory=OtelSettings)

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

    @model_validator(mode="after")
    def _sharding_needs_election(self) -> Settings:
        if self.health.sharding == "on" and not self.leader.enabled:
            raise ValueError("health.sharding: on needs leader.enabled: each shard is announced on its sidecar's election lease")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Env overrides the file; explicit init kwargs override both. A model loaded from a file
        # names it in its own config (config/load.py makes one per load).
        if settings_cls.model_config.get("yaml_file") is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, YamlConfigSettingsSource(settings_cls))

    def layout(self) -> KeyLayout:
        """Every key name the exporter uses, from these settings (sidecars sharing the records share a leader)."""
        return KeyLayout(
            root_key=self.root_key,
            records_prefix=self.records_prefix,
            health_prefix=self.health.prefix,
            election_key=self.leader.key,
        )

    def secret(self, name: SecretName) -> str | None:
        """One secret, from the environment or its file (a ConfigError naming the file's field if unreadable)."""
        return self.secret_sources()[name].read()

    def secret_sources(self) -> dict[SecretName, SecretSource]:
        """Where each secret comes from."""
        return {
            "etcd.password": SecretSource("etcd.password_file", self.etcd.password_file, self.etcd.password),
            "traefik.password": SecretSource("traefik.password_file", self.traefik.password_file),
            "discovery.password": SecretSource("discovery.password_file", self.discovery.password_file),
            "api.jwt_secret": SecretSource("api.jwt_secret_file", self.api.jwt_secret_file),
            "health.notify_token": SecretSource("health.notify_token_file", self.health.notify_token_file),
            "api.token": SecretSource("api.token_file", self.api.token_file, self.api.token),
        }
