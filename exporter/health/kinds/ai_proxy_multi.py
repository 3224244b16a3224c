"""`kind: ai-proxy-multi`: one checker per instance; an instance's `checks` override the defaults.

An instance is checked when the ingress enables health checks or the instance has its own
`checks`. `meta` is `{"instance": <name>}`.
"""

from __future__ import annotations

import dataclasses

from ...ingress import AiProxyMultiUpstream, HealthCheck
from ..checkers import CheckerTarget, Node, default_check


class AiProxyMultiKind:
    kind = "ai-proxy-multi"

    def targets(self, group: AiProxyMultiUpstream, resource: str, defaults: HealthCheck, protocol: str = "http") -> list[CheckerTarget]:
        base = default_check(defaults, protocol)
        out = []
        for instance in group.instances:
            checks = instance.checks
            if not defaults.enable and checks is None:
                continue
            check = base
            if checks is not None:
                check = dataclasses.replace(
                    base,
                    path=checks.path if checks.path is not None else base.path,
                    headers=tuple(sorted(checks.headers.items())),
                    interval=checks.interval if checks.interval is not None else base.interval,
                    max_retries=checks.max_retries if checks.max_retries is not None else base.max_retries,
                    timeout=checks.max_wait_time if checks.max_wait_time is not None else base.timeout,
                    expected_status=(
                        checks.expected_status_code if checks.expected_status_code is not None else base.expected_status
                    ),
                )
            out.append(
                CheckerTarget(
                    name=f"{resource}/{instance.name}",
                    nodes=(Node(instance.url),),
                    check=check,
                    plugin=self.kind,
                    meta={"instance": instance.name},
                )
            )
        return out
