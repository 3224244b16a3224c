"""Health: active probes, the lua-resty-healthcheck state machine, and the checker plugin hook."""
