"""The fault campaign: a test tool (record, inject, check), not part of the daemon."""

VOID = 3  # the exit code of a run in which etcd itself lost writes: it judges nothing
