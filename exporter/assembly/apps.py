"""The HTTP applications of a daemon: the control server's routes (one line per page) and the push API."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from loguru import logger

from ..control.access import security_headers, token_required
from ..control.convergence import convergence_routes
from ..control.events import events_routes
from ..control.healthcheck import healthcheck_routes
from ..control.mirror import mirror_routes
from ..control.server import control_app
from ..control.status_page import StatusPages
from ..errors import ConfigError
from ..sources.api import is_loopback, push_api_app
from .parts import Parts


def control_server(parts: Parts) -> web.Application:
    """The control server's application: monitoring, health, convergence, the mirror, events and the status page.

    A new page is a module under control/ with its routes, and one line here.
    """
    reconciler = parts.reconciler
    routes = healthcheck_routes(parts.health, lambda owner: reconciler.store.get(owner) is not None, health_headers(parts))
    routes += convergence_routes(parts.observer, reconciler.advice.overlapping_roots, reconciler.pacer.backlog)
    routes += mirror_routes(reconciler.mirror_summary)
    routes += events_routes(parts.events)
    routes += StatusPages(parts.status).routes()
    settings = parts.settings
    middlewares = [security_headers()]
    if not is_loopback(settings.control.listen):
        # Beyond loopback the page and its JSON ask for the push API's credentials (monitoring paths stay open).
        required, login = token_required(settings.secret("api.token"), settings.secret("api.jwt_secret"), settings.control.open_paths)
        middlewares.append(required)
        routes += login
    return control_app(parts.readiness.reasons, parts.metrics.registry, routes, middlewares)


def health_headers(parts: Parts) -> Callable[[], dict[str, str]]:
    """Which exporter's probes a health answer reflects, and how old its newest document is."""
    leadership, shared = parts.leadership, parts.shared

    def headers() -> dict[str, str]:
        if leadership is None:
            return {}
        if leadership.is_leader():
            return {"X-Health-Leader": leadership.identity, "X-Health-Age": "0"}
        leader, age = shared.leader_and_age() if shared else (None, None)
        return {"X-Health-Leader": leader or "", "X-Health-Age": "" if age is None else f"{age:.1f}"}

    return headers


def push_api(parts: Parts) -> web.Application | None:
    """The push API (None when disabled); refuses to serve it without a token beyond loopback."""
    settings = parts.settings
    api = settings.api
    if not api.enabled:
        return None
    token, jwt_secret = settings.secret("api.token"), settings.secret("api.jwt_secret")
    if token is None and jwt_secret is None:
        if not (api.allow_unauthenticated_loopback and is_loopback(api.listen)):
            raise ConfigError(
                "api: no token configured (api.token_file or EXPORTER_API__TOKEN); to serve the push API "
                "without one, set api.allow_unauthenticated_loopback and a loopback api.listen, "
                "or set api.enabled false"
            )
        logger.warning("push API on {} accepts requests without a token (loopback only)", api.listen)
    return push_api_app(
        parts.reconciler, token=token, jwt_secret=jwt_secret, max_body_bytes=api.max_body_bytes,
        ready=parts.readiness.accepting, serving=parts.serving, refused=parts.events.refused, metrics=parts.metrics,
        tracing=parts.tracing,
    )


def server_tls(cert_file: Path | None, key_file: Path | None, section: str) -> ssl.SSLContext | None:
    """The TLS context of a server the settings give a certificate (None: plain HTTP)."""
    if cert_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{section}.tls_cert_file/tls_key_file: cannot load {cert_file}: {exc}") from None
    return context
