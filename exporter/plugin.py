"""The public API for checker plugins: everything a third-party upstream kind may import.

A plugin is an object with `kind` and `targets(group, resource, defaults, protocol)`,
registered under the entry-point group `ENTRY_POINT_GROUP` (docs/plugins.md). Only the
names in `__all__` are kept stable for plugins; everything else in the package may change.
"""

from .health.checkers import ENTRY_POINT_GROUP, CheckConfig, CheckerKind, CheckerTarget, Node, Probe, default_check
from .health.state import Outcome
from .ingress import HealthCheck, PluginUpstream, Server

__all__ = [
    "ENTRY_POINT_GROUP",
    "CheckConfig",
    "CheckerKind",
    "CheckerTarget",
    "HealthCheck",
    "Node",
    "Outcome",
    "PluginUpstream",
    "Probe",
    "Server",
    "default_check",
]
