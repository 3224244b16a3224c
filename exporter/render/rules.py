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


def tcp_rule(hosts: list[str]) -> str:
    """`HostSNI(`*`)` without hosts (plain TCP), else an SNI match (TLS passthrough)."""
    if not hosts:
        return "HostSNI(`*`)"
    return " || ".join(f"HostSNI(`{h}`)" for h in hosts)
