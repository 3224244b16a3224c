"""The reconcile loop in parts: intents (requests and their answers), mirror (etcd as seen),
commit (plan and guarded writes), loop (scheduling), wired together by `Reconciler`."""

from .inbox import Inbox
from .loop import Cadence, Status
from .reconciler import Collaborators, Reconciler, TxnLimits

__all__ = ["Cadence", "Collaborators", "Inbox", "Reconciler", "Status", "TxnLimits"]
