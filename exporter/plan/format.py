"""Print a plan as a key diff: `+` added, `-` removed, `~` changed (old -> new)."""

from __future__ import annotations

from .plan import Plan

_COLORS = {"+": "\x1b[32m", "-": "\x1b[31m", "~": "\x1b[33m", "!": "\x1b[35m"}
_RESET = "\x1b[0m"


def _show(value: str) -> str:
    # One line per key: newlines in values (PEM) are escaped.
    return value.replace("\\", "\\\\").replace("\n", "\\n")


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
