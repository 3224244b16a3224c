"""Built-in checker kinds."""

from ..checkers import CheckerKind
from .ai_proxy_multi import AiProxyMultiKind
from .servers import ServersKind

BUILTIN: list[CheckerKind] = [ServersKind(), AiProxyMultiKind()]

__all__ = ["BUILTIN", "AiProxyMultiKind", "ServersKind"]
