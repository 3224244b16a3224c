"""Assembly: every part of a daemon built from the settings, wired in order, before anything runs.

`factories` builds one part each (the CLI's `diff` and `render` use them without a daemon),
`parts` wires them all (`assemble`), `readiness` says why a daemon is not ready, `apps` composes
the control server's routes and the push API, `tasks` lists what a daemon runs. The daemon
(exporter/daemon.py) only starts, runs and stops them.
"""

from .factories import build_reconciler, edge_policy, etcd_client, renderer_for
from .parts import Parts, assemble

__all__ = ["Parts", "assemble", "build_reconciler", "edge_policy", "etcd_client", "renderer_for"]
