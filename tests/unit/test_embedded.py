"""Free ports for the embedded etcd, Traefik and daemons started side by side."""

from __future__ import annotations

from exporter.embedded import free_port


def test_a_port_is_never_handed_out_twice() -> None:
    # Ports asked for before any is bound (three sidecars' API and control ports) must differ; the
    # kernel alone offers a just-closed port again (400 draws collided most of the time before).
    ports = [free_port() for _ in range(400)]
    assert len(set(ports)) == len(ports)
