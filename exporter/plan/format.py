"""Print a plan as a key diff: `+` added, `-` removed, `~` changed (old -> new)."""

from __future__ import annotations

import re

from .plan import Plan

_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----\n?", re.S)
_HEADERS = re.compile(r'("headers":\{)([^{}]*)(\})')
_HEADER_VALUE = re.compile(r'("(?:[^"\\]|\\.)*":)"(?:[^"\\]|\\.)*"')

_COLORS = {"+": "\x1b[32m", "-": "\x1b[31m", "~": "\x1b[33m", "!": "\x1b[35m"}
_RESET = "\x1b[0m"


def redact(value: str) -> str:
    """Hide secrets a value may hold: private keys, and check headers (tokens) inside records."""
    value = _PRIVATE_KEY.sub("<redacted private key>", value)
    return _HEADERS.sub(lambda m: m.group(1) + _HEADER_VALUE.sub(r'\1"<redacted>"', m.group(2)) + m.group(3), value)


def _show(value: str) -> str:
    # One line per key: newlines in values (PEM) are escaped.
    return redact(value).replace("\\", "\\\\").replace("\n", "\\n")


def format_plan(plan: Plan, color: bool = False) -> str:
    """The diff text; empty when there is nothing to change and nothing foreign."""
    lines = []
    for change in plan.changes():
        sign = change.sign
        if sign == "+":
            text = f"+ {change.key} = {_show(change.new or '')}"
        elif sign == "-":
            text = f"- {change.key} (was {_show(change.old or '')})"
        else:
            text = f"~ {change.key}: {_show(change.old or '')} -> {_show(change.new or '')}"
        lines.append(f"{_COLORS[sign]}{text}{_RESET}" if color else text)
    for key in plan.foreign:
        text = f"! {key} (foreign key under a managed root: left alone)"
        lines.append(f"{_COLORS['!']}{text}{_RESET}" if color else text)
    return "\n".join(lines) + ("\n" if lines else "")
