"""The fault campaign: a test tool (record, inject, check), not part of the daemon."""
