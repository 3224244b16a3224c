"""Traces of pushes, commits, Traefik serving them, and health: the hooks (`hooks.py`, no-ops), their
OpenTelemetry spans (`otel.py`, `batch.py`, `served.py`; imported only when enabled) and the setup from
the settings (`setup.py`)."""
