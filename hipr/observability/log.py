"""Structured logs for the worker and the CLI, through structlog over the stdlib.

structlog renders; the stdlib's ``logging`` routes and filters, so that per-logger
levels (``logging.getLogger("hipr.session").setLevel(...)``) and the records of other
libraries go the same way. Output is a readable console rendering on a terminal and
JSON lines (journald- and collector-friendly) otherwise, or when asked for.

Secrets never reach the output: :func:`redact_secrets` runs on every event, ours and
foreign ones alike, and replaces the value of any key that names a credential.

A flood of one error (a scanner hitting the port, a client retrying a bad call) must
not bury everything else: :class:`RateLimiter` lets the first warning or error of a
kind through, drops repeats for a window (10 s), then writes one line
``suppressed N similar`` with the count. Levels can be set per logger
(``log_levels = {"hipr.connection" = "debug"}`` in the worker config).
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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


#: Seconds during which repeats of one warning or error are counted, not written.
RATE_LIMIT_WINDOW = 10.0
#: Marks the summary lines the limiter writes itself, so that they are never limited.
_SUMMARY_MARK = "_hipr_rate_limit_summary"
_LIMITED_LEVELS = frozenset({"warning", "error", "critical", "exception"})


@dataclass(slots=True)
class _Window:
    start: float
    logger: str
    level: str
    event: str
    error: str | None
    suppressed: int = 0


class RateLimiter:
    """structlog processor: repeats of one warning or error within ``window`` seconds are
    dropped and counted; once the window is over, one line ``suppressed N similar``
    (with ``similar_to`` and ``error``) reports them.

    "One error" is the same logger, level, event and ``error`` field (or exception).
    The summary is written when the next event of any kind is logged after the window,
    or by :meth:`flush` (at exit). Thread-safe.
    """

    def __init__(
        self,
        window: float = RATE_LIMIT_WINDOW,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        self.window = window
        self.clock = clock
        self.max_keys = max_keys
        self._windows: dict[tuple[str, str, str, str | None], _Window] = {}
        self._lock = threading.Lock()
        self._next_due = math.inf

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
        if event_dict.pop(_SUMMARY_MARK, False):
            return event_dict
        now = self.clock()
        if now >= self._next_due:
            for window in self._take_due(now):
                _emit_summary(window, self.window)
        level = str(event_dict.get("level", method_name))
        if self.window <= 0 or level not in _LIMITED_LEVELS:
            return event_dict
        error = _error_text(event_dict)
        name = str(event_dict.get("logger", ""))
        key = (name, level, str(event_dict.get("event", "")), error)
        with self._lock:
            found = self._windows.get(key)
            if found is not None and now - found.start < self.window:
                found.suppressed += 1
                self._next_due = min(self._next_due, found.start + self.window)
                raise structlog.DropEvent
            if len(self._windows) >= self.max_keys:
                self._prune(now)
            self._windows[key] = _Window(now, name, level, key[2], error)
        return event_dict

    def _take_due(self, now: float) -> list[_Window]:
        """Remove finished windows; those that suppressed something are returned."""
        with self._lock:
            due = [w for w in self._windows.values() if now - w.start >= self.window]
            for w in due:
                del self._windows[(w.logger, w.level, w.event, w.error)]
            pending = [w.start + self.window for w in self._windows.values() if w.suppressed]
            self._next_due = min(pending, default=math.inf)
        return [w for w in due if w.suppressed]

    def _prune(self, now: float) -> None:
        """Make room (lock held): drop finished windows, else the oldest quiet ones."""
        for key, w in list(self._windows.items()):
            if now - w.start >= self.window and not w.suppressed:
                del self._windows[key]
        while len(self._windows) >= self.max_keys:
            del self._windows[next(iter(self._windows))]

    def flush(self) -> None:
        """Write the summary of every window that suppressed something, now."""
        with self._lock:
            pending = [w for w in self._windows.values() if w.suppressed]
            self._windows.clear()
            self._next_due = math.inf
        for window in pending:
            _emit_summary(window, self.window)


def _error_text(event_dict: EventDict) -> str | None:
    error = event_dict.get("error")
    if error is not None:
        return str(error)
    exc_info = event_dict.get("exc_info")
    if exc_info is True:
        exc_info = sys.exc_info()
    if isinstance(exc_info, BaseException):
        return repr(exc_info)
    if isinstance(exc_info, tuple) and len(exc_info) == 3 and exc_info[1] is not None:
        return repr(exc_info[1])
    return None


def _emit_summary(window: _Window, seconds: float) -> None:
    level = LEVELS.get(window.level, logging.ERROR)
    fields: dict[str, Any] = {"similar_to": window.event, "window_s": seconds, _SUMMARY_MARK: True}
    if window.error is not None:
        fields["error"] = window.error
    structlog.stdlib.get_logger(window.logger).log(
        level, f"suppressed {window.suppressed} similar", **fields
    )


class SafePrintLogger(structlog.PrintLogger):
    """structlog's default logger, except that a line it cannot write (disk full, a
    closed pipe or file) is dropped: logging must never take the worker down."""

    def msg(self, message: str) -> None:
        """Print ``message``, or drop it when the output fails."""
        try:
            super().msg(message)
        except (OSError, ValueError):
            pass

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def _event_and_fields(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> str:
    """The last processor of the library default: ``event key=value ...``, one string for
    the stdlib record's message, whatever handler the program installed renders it."""
    event = str(event_dict.pop("event", ""))
    fields = " ".join(f"{k}={v!r}" for k, v in event_dict.items())
    return f"{event} {fields}" if fields else event


#: The stdlib logger above all of hipr's: it holds the library's NullHandler.
LIBRARY_LOGGER = "hipr"


def install_library_default() -> None:
    """Until a program configures logging, hipr logs as a library should: through the
    stdlib's ``logging`` under the ``hipr`` logger, which has only a
    :class:`logging.NullHandler`. Nothing is written unless the program adds a handler
    (``logging.basicConfig()``, :func:`hipr.log_to_stderr`), and Python's last-resort
    handler stays quiet too. The worker's CLI replaces this with
    :func:`configure_logging`. A program that configured structlog itself keeps its
    set-up."""
    library = logging.getLogger(LIBRARY_LOGGER)
    if not any(isinstance(h, logging.NullHandler) for h in library.handlers):
        library.addHandler(logging.NullHandler())
    if not structlog.is_configured():
        structlog.configure(
            processors=[
                structlog.stdlib.filter_by_level,
                structlog.stdlib.PositionalArgumentsFormatter(),
                redact_secrets,
                structlog.processors.format_exc_info,
                _event_and_fields,
            ],
            logger_factory=structlog.stdlib.LoggerFactory(),
            wrapper_class=structlog.stdlib.BoundLogger,
            cache_logger_on_first_use=False,
        )


install_library_default()


def log_to_stderr(level: str = "info", fmt: str = "console") -> None:
    """Opt in to hipr's log lines on stderr (the library writes none by default):
    ``hipr.log_to_stderr("debug")`` shows reconnects, resumes and lost sessions as they
    happen. ``fmt`` is ``console`` or ``json``. The same set-up the worker uses
    (:func:`configure_logging`), so it also routes other libraries' records there."""
    configure_logging(level, fmt, stream=sys.stderr)


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
    level: str | None = "info",
    fmt: str | None = "auto",
    stream: IO[str] | None = None,
    levels: Mapping[str, str] | None = None,
    *,
    rate_limit_window: float = RATE_LIMIT_WINDOW,
) -> None:
    """Send hipr's logs (and the stdlib's) to ``stream`` (default: ``sys.stderr`` now).

    ``level`` is one of debug, info, warning, error; ``None`` reads ``$HIPR_LOG_LEVEL``.
    ``fmt`` is ``console``, ``json``, or ``auto`` (console on a terminal, else JSON);
    ``None`` reads ``$HIPR_LOG_FORMAT``. Colours only on a terminal and without
    ``$NO_COLOR``. ``levels`` sets levels per logger, e.g. ``{"hipr.connection":
    "debug"}`` (a logger's children follow it). Repeated warnings and errors are
    collapsed for ``rate_limit_window`` seconds (0: never). Calling it again replaces
    the previous set-up.
    """
    global _limiter
    level_name = resolve_level(level)
    for lvl in (levels or {}).values():
        resolve_level(lvl)  # a bad level fails before anything changes
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
    # Counts pending in a replaced set-up are dropped: its output may be gone already.
    _limiter = RateLimiter(rate_limit_window)
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            _limiter,
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
    set_levels(level_name, levels)


def set_levels(level: str | None, levels: Mapping[str, str] | None = None) -> None:
    """Set the root level and the per-logger ``levels`` (e.g. on a config reload);
    loggers given a level before and not now follow the root again."""
    root_level = LEVELS[resolve_level(level)]
    logger_levels = {name: LEVELS[resolve_level(lvl)] for name, lvl in (levels or {}).items()}
    logging.getLogger().setLevel(root_level)
    for name in _levelled - set(logger_levels):
        logging.getLogger(name).setLevel(logging.NOTSET)
    for name, value in logger_levels.items():
        logging.getLogger(name).setLevel(value)
    _levelled.clear()
    _levelled.update(logger_levels)


#: The limiter of the current set-up (flushed at exit) and the loggers given levels.
_limiter: RateLimiter | None = None
_levelled: set[str] = set()


@atexit.register
def _flush_at_exit() -> None:
    if _limiter is not None:
        try:
            _limiter.flush()
        except Exception:
            pass


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
