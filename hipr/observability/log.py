"""Structured logs for the worker and the CLI, through structlog over the stdlib.

structlog renders; the stdlib's ``logging`` routes and filters, so that per-logger
levels (``logging.getLogger("hipr.session").setLevel(...)``) and the records of other
libraries go the same way. Output is a readable console rendering on a terminal and
JSON lines (journald- and collector-friendly) otherwise, or when asked for.

Secrets never reach the output: :func:`redact_secrets` runs on every event, ours and
foreign ones alike, and replaces the value of any key that names a credential.

A flood of one event (a scanner hitting the port, a client retrying a bad call, a
thousand idle connections timing out) must not bury everything else:
:class:`RateLimiter` writes a few lines of one event per window (10 s), info included,
and the first of each warning's error, drops the rest, then writes one line
``suppressed N similar`` with the count and a few of their peers; the standard
library's records go through the same limits (:class:`StdlibRateLimit`). Levels can
be set per logger (``log_levels = {"hipr.connection" = "debug"}`` in the worker config).
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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


#: Seconds during which repeats of one event are counted, not written.
RATE_LIMIT_WINDOW = 10.0
#: Lines of one event (logger, level, event name) written per window, whatever their
#: fields; the rest are counted into one summary line.
RATE_LIMIT_BURST = 5
#: Peer addresses and error texts a summary line names, at most.
SUMMARY_SAMPLES = 5
#: Marks the summary lines the limiter writes itself, so that they are never limited.
_SUMMARY_MARK = "_hipr_rate_limit_summary"
#: Levels whose repeats of one error are collapsed from the first (besides the burst).
_DEDUPED_LEVELS = frozenset({"warning", "error", "critical", "exception"})
_LIMITED_LEVELS = _DEDUPED_LEVELS | {"info"}
_DIGITS = re.compile(r"\d+")


@dataclass(slots=True)
class _Window:
    start: float
    logger: str
    level: str
    event: str
    #: The error text a window of repeats of one error is about; None for the window
    #: of a whole event.
    error: str | None
    passed: int = 0
    suppressed: int = 0
    peers: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def note(self, peer: object, error: str | None) -> None:
        self.suppressed += 1
        if peer is not None and len(self.peers) < SUMMARY_SAMPLES:
            text = str(peer)
            if text not in self.peers:
                self.peers.append(text)
        if (
            self.error is None
            and error is not None
            and len(self.errors) < SUMMARY_SAMPLES
            and error not in self.errors
        ):
            self.errors.append(error)


_Key = tuple[str, ...]


class RateLimiter:
    """Log lines limited by event: within ``window`` seconds, at most ``burst`` lines of
    one event (the same logger, level and event name, whatever the other fields say) are
    written, info lines included; warnings and errors also drop repeats of one error at
    once (the same ``error`` field or exception, its numbers ignored). What is dropped
    is counted, and once the window is over one line ``suppressed N similar`` reports
    it, with ``similar_to``, the ``error``, and up to :data:`SUMMARY_SAMPLES` ``peers``
    (and ``errors``) of the dropped lines. Debug lines, asked for, are never limited.

    Summaries are written when the next event of any kind is logged after the window,
    by :meth:`flush` (at exit), and, once :meth:`start` was called, by a background
    thread when their window ends. Thread-safe; the state is bounded by ``max_keys``.
    """

    def __init__(
        self,
        window: float = RATE_LIMIT_WINDOW,
        *,
        burst: int = RATE_LIMIT_BURST,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        self.window = window
        self.burst = max(1, burst)
        self.clock = clock
        self.max_keys = max_keys
        self._windows: dict[_Key, _Window] = {}
        self._lock = threading.Lock()
        self._next_due = math.inf
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
        if event_dict.pop(_SUMMARY_MARK, False):
            return event_dict
        level = str(event_dict.get("level", method_name))
        if self.admit(
            str(event_dict.get("logger", "")),
            level,
            str(event_dict.get("event", "")),
            _error_text(event_dict),
            event_dict.get("peer"),
        ):
            return event_dict
        raise structlog.DropEvent

    def admit(
        self, logger: str, level: str, event: str, error: str | None, peer: object = None
    ) -> bool:
        """True when a line of ``event`` may be written now; else it is counted."""
        now = self.clock()
        if now >= self._next_due:
            for window in self._take_due(now):
                _emit_summary(window, self.window)
        if self.window <= 0 or level not in _LIMITED_LEVELS:
            return True
        if error is not None:
            error = error[:300]
        late: _Window | None = None
        with self._lock:
            error_key: _Key | None = None
            if level in _DEDUPED_LEVELS:
                error_key = ("error", logger, level, event, _DIGITS.sub("#", error or ""))
                repeat = self._windows.get(error_key)
                if repeat is not None and now - repeat.start < self.window:
                    repeat.note(peer, error)
                    self._due_at(repeat.start + self.window)
                    return False
            event_key = ("event", logger, level, event)
            whole = self._windows.get(event_key)
            if whole is None or now - whole.start >= self.window:
                if whole is not None and whole.suppressed:
                    late = whole  # over, but not yet summarised (another thread's race)
                whole = self._open(event_key, _Window(now, logger, level, event, None), now)
            if whole.passed >= self.burst:
                whole.note(peer, error)
                self._due_at(whole.start + self.window)
                admitted = False
            else:
                whole.passed += 1
                if error_key is not None:
                    self._open(error_key, _Window(now, logger, level, event, error), now)
                admitted = True
        if late is not None:
            _emit_summary(late, self.window)
        return admitted

    def _open(self, key: _Key, window: _Window, now: float) -> _Window:
        """Start ``window`` under ``key`` (lock held), making room if need be."""
        if len(self._windows) >= self.max_keys:
            self._prune(now)
        self._windows[key] = window
        return window

    def _due_at(self, when: float) -> None:
        """A summary is due at ``when`` (lock held): wake the background writer."""
        if when < self._next_due:
            self._next_due = when
            self._wake.set()

    def _take_due(self, now: float) -> list[_Window]:
        """Remove finished windows; those that suppressed something are returned."""
        with self._lock:
            due = [(k, w) for k, w in self._windows.items() if now - w.start >= self.window]
            for key, _ in due:
                del self._windows[key]
            pending = [w.start + self.window for w in self._windows.values() if w.suppressed]
            self._next_due = min(pending, default=math.inf)
        return [w for _, w in due if w.suppressed]

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

    def start(self) -> None:
        """Write summaries from a background thread as their windows end, not only when
        the next line is logged (a flood that stops is still reported on time)."""
        if self._thread is None and self.window > 0:
            self._thread = threading.Thread(
                target=self._write_due, name="hipr-log-summaries", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """Stop the background thread (the set-up is being replaced)."""
        self._closed = True
        self._wake.set()

    def _write_due(self) -> None:
        while not self._closed:
            wait = self._next_due - self.clock()
            self._wake.wait(None if math.isinf(wait) else max(0.01, wait))
            self._wake.clear()
            if self._closed:
                return
            now = self.clock()
            if now >= self._next_due:
                try:
                    for window in self._take_due(now):
                        _emit_summary(window, self.window)
                except Exception:  # logging must never take the worker down
                    pass


class StdlibRateLimit(logging.Filter):
    """The same limits for the standard library's records (asyncio's "socket.accept()
    out of system resource", a library's warnings), keyed by their message template;
    structlog's own records have been through the limiter already."""

    def __init__(self, limiter: RateLimiter) -> None:
        super().__init__()
        self.limiter = limiter

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a record to drop."""
        if hasattr(record, "_logger") and hasattr(record, "_name"):
            return True  # from structlog
        error = repr(record.exc_info[1]) if record.exc_info and record.exc_info[1] else None
        return self.limiter.admit(
            record.name, record.levelname.lower(), str(record.msg), error, None
        )


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
    if window.errors:
        fields["errors"] = list(window.errors)
    if window.peers:
        fields["peers"] = list(window.peers)
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
    rate_limit_burst: int = RATE_LIMIT_BURST,
    background_summaries: bool = True,
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
    if _limiter is not None:
        _limiter.close()
    _limiter = RateLimiter(rate_limit_window, burst=rate_limit_burst)
    if background_summaries:
        _limiter.start()
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            # The limiter needs the level and logger name only: a line it drops (a
            # flood's) costs no timestamp nor redaction.
            *shared[:3],
            _limiter,
            *shared[3:],
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
    handler.addFilter(StdlibRateLimit(_limiter))
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
    if _limiter is None:
        return
    # At exit a handler's stream may already be closed (a test runner's capture): the
    # last summaries are then dropped without logging's "--- Logging error ---" report.
    raise_exceptions, logging.raiseExceptions = logging.raiseExceptions, False
    try:
        _limiter.flush()
    except Exception:
        pass
    finally:
        logging.raiseExceptions = raise_exceptions


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
