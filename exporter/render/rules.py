"""Traefik rule expressions built from validated ingress fields (exposed to templates)."""

from __future__ import annotations


def _host_matcher(host: str) -> str:
    if host.startswith("*."):
        suffix = host[2:].replace(".", r"\.")
        return f"HostRegexp(`^[a-z0-9-]+\\.{suffix}$`)"
    return f"Host(`{host}`)"


def host_rule(hosts: list[str]) -> str:
    """`Host(`a`)`, or `(Host(`a`) || Host(`b`))` for several hosts."""
    matchers = [_host_matcher(h) for h in hosts]
    return matchers[0] if len(matchers) == 1 else "(" + " || ".join(matchers) + ")"


def http_rule(hosts: list[str], path_prefix: str) -> str:
    """`(Host(`a`) || Host(`b`)) && PathPrefix(`/p`)`; the path part is left out for `/`."""
    rule = host_rule(hosts)
    if path_prefix != "/":
        rule += f" && PathPrefix(`{path_prefix}`)"
    return rule


def tcp_rule(hosts: list[str], allowed_client_ips: list[str] | None = None) -> str:
    """`HostSNI(`*`)` without hosts (plain TCP), else an SNI match (TLS passthrough); with an
    allowlist, `&& ClientIP(`cidr`)` (or-ed per CIDR): Traefik matches it on the connection's
    address before any router or service takes the connection (docs/key-layout.md)."""
    rule = " || ".join(f"HostSNI(`{h}`)" for h in hosts) if hosts else "HostSNI(`*`)"
    if not allowed_client_ips:
        return rule
    if len(hosts) > 1:
        rule = f"({rule})"
    clients = " || ".join(f"ClientIP(`{cidr}`)" for cidr in allowed_client_ips)
    return f"{rule} && ({clients})" if len(allowed_client_ips) > 1 else f"{rule} && {clients}"
