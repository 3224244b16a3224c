"""Render: ingress records -> Traefik objects (templates) -> validated -> flattened KV."""
