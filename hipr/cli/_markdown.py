"""Docstring and comment text as Markdown, for the generated reference pages."""

from __future__ import annotations

import inspect
import re
from enum import Enum


def member_comments(cls: type[Enum]) -> dict[str, str]:
    """The ``#:`` comments written above the members of an enum class, by member name."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        if (m := re.match(r"^([A-Z][A-Z0-9_]*)\s*=", stripped)) and pending:
            out[m.group(1)] = " ".join(pending)
        pending = []
    return out


def rst_to_markdown(text: str) -> str:
    """Docstring markup to Markdown: ````x```` becomes ```x```, roles are dropped."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")
