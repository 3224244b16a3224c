"""The control server: liveness, readiness, metrics and health-check views."""
