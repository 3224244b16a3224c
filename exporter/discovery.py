"""Registration in Backend.AI's service discovery on Redis/Valkey: how the AppProxy coordinator finds this worker.

The exact layout Backend.AI's `RedisServiceDiscovery` reads: one hash per service at
`service_discovery.<service_group>.<id>`, one field per top-level field of its
`ServiceMetadata`, each value JSON-encoded (strings too), written with HSET then EXPIRE in
one transaction. Every heartbeat rewrites the whole hash and its expiry, so a Redis that
restarted empty has the registration back at the next heartbeat. Unregistering is a DEL.
A Redis outage is reported (readiness, metrics) and never stops the push API.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from loguru import logger
from redis.exceptions import RedisError

from .config import Settings
from .metrics import Metrics

KEY_PREFIX = "service_discovery"


@dataclass(frozen=True)
class Registration:
    """What this worker announces (Backend.AI's ServiceMetadata)."""

    service_group: str
    address: str
    port: int
    protocol: str
    prometheus_address: str
    labels: dict[str, str]
    display_name: str
    version: str
    registered_at: float = field(default_factory=time.time)

    @property
    def id(self) -> str:
        """`uuid5(NAMESPACE_DNS, "<group>/<prometheus_address>")`, as ServiceMetadata.for_endpoint derives it."""
        return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.service_group}/{self.prometheus_address}"))

    @property
    def key(self) -> str:
        """The hash key discovery scans (`service_discovery.<group>.*`)."""
        return f"{KEY_PREFIX}.{self.service_group}.{self.id}"

    def fields(self, now: float) -> dict[str, str]:
        """Each top-level field JSON-encoded, with the heartbeat time `now`."""
        metadata: dict[str, Any] = {
            "id": self.id,
            "display_name": self.display_name,
            "service_group": self.service_group,
            "version": self.version,
            "endpoint": {"address": self.address, "port": self.port, "protocol": self.protocol,
                         "prometheus_address": self.prometheus_address},
            "health_status": {"registration_time": self.registered_at, "last_heartbeat": now},
            "labels": self.labels,
        }
        return {name: json.dumps(value) for name, value in metadata.items()}


def registration_of(settings: Settings, version: str) -> Registration:
    """The registration the settings describe (`discovery.advertise` is required)."""
    d = settings.discovery
    if d.advertise is None:
        from .errors import ConfigError

        raise ConfigError("discovery.advertise: the host:port the coordinator should call is required with discovery.redis_url")
    host, _, port = d.advertise.rpartition(":")
    control_port = settings.control.listen.rpartition(":")[2]
    labels = dict(d.labels)
    if d.authorities:
        labels.setdefault("authority", ",".join(d.authorities))
    name = d.authorities[0] if d.authorities else d.advertise
    protocol = "https" if settings.api.tls_cert_file else "http"
    return Registration(d.service_group, host, int(port), protocol, f"{host}:{control_port}", labels,
                        f"appproxy-worker-{name}", version)


class Discovery:
    """Keeps one registration alive in Redis; `readiness()` says when it cannot."""

    @property
    def registered(self) -> bool:
        """True while the registration is current."""
        return self._registered

    def __init__(
        self, registration: Registration, url: str, *, password: str | None, ttl: int, heartbeat: float,
        metrics: Metrics | None = None,
    ) -> None:
        self.registration = registration
        self._redis = aioredis.Redis.from_url(url, password=password, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._ttl = ttl
        self._heartbeat = heartbeat
        self._error: str | None = None
        self._registered = False
        metrics = metrics or Metrics()
        self._errors = metrics.discovery_errors
        metrics.discovery_registered.read_from(lambda: [((), 1.0 if self._registered else 0.0)])

    async def run(self) -> None:
        """Register, then heartbeat until cancelled (retrying every second while Redis fails)."""
        while True:
            await self._register()
            await asyncio.sleep(self._heartbeat if self._error is None else min(self._heartbeat, 1.0))

    async def _register(self) -> None:
        key = self.registration.key
        try:
            fields: dict[Any, Any] = self.registration.fields(time.time())
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping=fields)
                pipe.expire(key, self._ttl)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            self._errors.inc()
            self._registered = False
            if self._error is None:
                logger.warning("service discovery: cannot register {} ({}); retrying", key, type(exc).__name__)
            self._error = f"{type(exc).__name__}: {exc}".split("\n")[0][:200]
            return
        if not self._registered:
            logger.info("service discovery: registered {} ({})", key, self.registration.display_name)
        self._error = None
        self._registered = True

    async def unregister(self) -> None:
        """Remove the registration (on shutdown) and close the connection."""
        try:
            await self._redis.delete(self.registration.key)
            logger.info("service discovery: unregistered {}", self.registration.key)
        except (RedisError, OSError) as exc:
            logger.warning("service discovery: could not unregister ({}); it expires in {}s", type(exc).__name__, self._ttl)
        finally:
            self._registered = False
            await self._redis.aclose()

    def readiness(self) -> list[str]:
        """`discovery: redis unreachable: ...` while the registration cannot be written."""
        return [] if self._error is None else [f"discovery: redis unreachable: {self._error}"]
