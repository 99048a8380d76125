"""Structured logs for the worker and the CLI, through structlog over the stdlib.

structlog renders; the stdlib's ``logging`` routes and filters, so that per-logger
levels (``logging.getLogger("hipr.session").setLevel(...)``) and the records of other
libraries go the same way. Output is a readable console rendering on a terminal and
JSON lines (journald- and collector-friendly) otherwise, or when asked for.

Secrets never reach the output: :func:`redact_secrets` runs on every event, ours and
foreign ones alike, and replaces the value of any key that names a credential.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import IO, Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
FORMATS = ("auto", "console", "json")

#: Keys whose values are never logged (compared case-insensitively).
SECRET_KEYS = frozenset({"token", "resume_token", "password", "secret"})
#: Keys ending in one of these are treated as secrets too (``admin_token``, ``api_secret``).
SECRET_SUFFIXES = ("_token", "_password", "_secret")
REDACTED = "[redacted]"

_HANDLER_MARK = "_hipr_handler"


def is_secret_key(key: object) -> bool:
    """True when a log field named ``key`` must not be printed."""
    if not isinstance(key, str):
        return False
    k = key.lower()
    return k in SECRET_KEYS or k.endswith(SECRET_SUFFIXES)


def _redact(value: Any, depth: int = 0) -> Any:
    if depth > 4:
        return value
    if isinstance(value, Mapping):
        return {
            k: REDACTED if is_secret_key(k) else _redact(v, depth + 1) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(_redact(v, depth + 1) for v in value)
    return value


def redact_secrets(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """structlog processor: replace the values of secret-named keys, nested ones included."""
    for key in list(event_dict):
        if is_secret_key(key):
            event_dict[key] = REDACTED
        elif isinstance(event_dict[key], Mapping | list | tuple):
            event_dict[key] = _redact(event_dict[key])
    return event_dict


def _shared_processors() -> list[Processor]:
    """Run on every event: structlog's own and foreign stdlib records."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_secrets,
    ]


_FIRST = ("timestamp", "level", "logger", "event")


def _order_keys(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Put timestamp, level, logger and event first, so JSON lines read well too."""
    head = {k: event_dict.pop(k) for k in _FIRST if k in event_dict}
    head.update(event_dict)
    return head


def resolve_level(level: str | None) -> str:
    """The level name to use: ``level``, else ``$HIPR_LOG_LEVEL``, else ``"info"``."""
    name = (level or os.environ.get("HIPR_LOG_LEVEL") or "info").strip().lower()
    if name == "warn":
        name = "warning"
    if name not in LEVELS:
        raise ValueError(f"unknown log level {name!r} (known: {', '.join(LEVELS)})")
    return name


def configure_logging(
    level: str | None = "info", fmt: str | None = "auto", stream: IO[str] | None = None
) -> None:
    """Send hipr's logs (and the stdlib's) to ``stream`` (default: ``sys.stderr`` now).

    ``level`` is one of debug, info, warning, error; ``None`` reads ``$HIPR_LOG_LEVEL``.
    ``fmt`` is ``console``, ``json``, or ``auto`` (console on a terminal, else JSON);
    ``None`` reads ``$HIPR_LOG_FORMAT``. Colours only on a terminal and without
    ``$NO_COLOR``. Calling it again replaces the previous set-up.
    """
    level_name = resolve_level(level)
    fmt = (fmt or os.environ.get("HIPR_LOG_FORMAT") or "auto").strip().lower()
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r} (known: {', '.join(FORMATS)})")
    out = stream if stream is not None else sys.stderr
    tty = bool(getattr(out, "isatty", lambda: False)())
    if fmt == "auto":
        fmt = "console" if tty else "json"

    renderer: list[Processor]
    if fmt == "json":
        renderer = [
            structlog.processors.format_exc_info,
            _order_keys,
            structlog.processors.JSONRenderer(default=str, sort_keys=False),
        ]
    else:
        # ConsoleRenderer formats exceptions itself (pretty tracebacks).
        colors = tty and not os.environ.get("NO_COLOR")
        renderer = [structlog.dev.ConsoleRenderer(colors=colors)]

    shared = _shared_processors()
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached: loggers made at import time must follow a later configure call.
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    setattr(handler, _HANDLER_MARK, True)

    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS[level_name])


def get_logger(name: str, **bound: Any) -> structlog.stdlib.BoundLogger:
    """A structlog logger named ``name`` (e.g. ``"hipr.server"``) with ``bound`` fields.

    It stays lazy: made at import time, it still follows a later :func:`configure_logging`.
    """
    logger: structlog.stdlib.BoundLogger = structlog.stdlib.get_logger(name, **bound)
    return logger


def bind_context(**fields: Any) -> Mapping[str, Any]:
    """Add fields to every log line of the current task (contextvars); returns tokens
    to pass to ``structlog.contextvars.reset_contextvars``."""
    return structlog.contextvars.bind_contextvars(**fields)
