"""traefik-etcd-exporter: keeps Traefik's etcd key layout equal to pushed ingress state."""

__version__ = "0.1.0"
