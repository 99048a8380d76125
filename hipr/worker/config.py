"""The worker's configuration: one schema, read from TOML, checked before anything starts.

The dataclasses below are the single source of truth: the loader, the validation and the
configuration reference (:func:`config_reference_markdown`) are all derived from their
fields. Each field carries its documentation in ``metadata["doc"]``; ``metadata["size"]``
marks byte sizes (written ``"64MiB"`` or as an integer), ``metadata["choices"]`` the
allowed values of a string.

A mistake in the file is reported before the worker listens on anything, as a
:class:`ConfigError` naming the file and the dotted key, e.g.
``config/worker.toml: emulator.total_memory: expected a size ...``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hipr.cpus import auto_spin_wait

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

#: Units :func:`parse_size` accepts (case-insensitive): binary ``KiB``..., decimal ``KB``...
SIZE_UNITS: dict[str, int] = {
    "b": 1,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "console", "json")
BACKENDS = ("auto", "emulator", "cuda", "hip")
ISOLATION_MODES = ("auto", "none", "process", "session")
#: The longest ``spin_wait``: a second of a busy core per request is never what was meant.
MAX_SPIN_WAIT = 1.0
#: Most data links one session may attach (each is a thread of the worker while it lives).
MAX_DATA_LINKS = 16

#: Environment variables :func:`load_config` honours when given ``environ``.
ENV_KEYS: dict[str, str] = {"HIPR_LOG_LEVEL": "log_level", "HIPR_LOG_FORMAT": "log_format"}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://\S*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class ConfigError(ValueError):
    """A configuration mistake; the message names the source and the dotted key.

    ``source`` is the file (or ``"command line"``, or an environment variable) and
    ``key`` the dotted key at fault, or ``None`` for an error about the whole file.
    """

    def __init__(self, message: str, *, source: str = "", key: str | None = None) -> None:
        self.source = source
        self.key = key
        self.reason = message
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}: {message}" if key else f"{where}{message}")


def parse_size(value: int | str) -> int:
    """Bytes of a size written as an integer or a string such as ``"64MiB"``.

    ``KiB``/``MiB``/``GiB``/``TiB`` are powers of 1024, ``KB``/``MB``/``GB``/``TB`` powers
    of 1000, ``B`` or no unit are bytes; units are case-insensitive and a space may stand
    before them. ``"1.5GiB"`` is allowed when it comes to a whole number of bytes.
    Raises :class:`ValueError` for anything else, a negative number included.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a size, got {value!r}")
    m = _SIZE_RE.match(value)
    if not m:
        raise ValueError(f"not a size: {value!r} (write e.g. 512KiB, 64MiB, 8GiB or bytes)")
    number, unit = m.group(1), m.group(2).lower() or "b"
    if unit not in SIZE_UNITS:
        raise ValueError(
            f"unknown size unit {m.group(2)!r} in {value!r} "
            "(known: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
        )
    if "." in number:
        whole, frac = number.split(".")
        # Exact arithmetic: floats would turn "0.1KB" into 100.00000000000001.
        scaled = int(whole + frac) * SIZE_UNITS[unit]
        divisor: int = 10 ** len(frac)
        if scaled % divisor:
            raise ValueError(f"{value!r} is not a whole number of bytes")
        return scaled // divisor
    return int(number) * SIZE_UNITS[unit]


def format_size(n: int) -> str:
    """The shortest exact spelling of ``n`` bytes in binary units: ``"64MiB"``, ``"1000B"``."""
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def _doc(text: str, **extra: Any) -> dict[str, Any]:
    return {"doc": text, **extra}


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Certificates of the worker's ``tls://`` listeners."""

    certfile: Path | None = field(
        default=None,
        metadata=_doc("PEM certificate chain the worker presents on `tls://` listeners."),
    )
    keyfile: Path | None = field(default=None, metadata=_doc("PEM private key of `certfile`."))
    client_ca: Path | None = field(
        default=None,
        metadata=_doc("PEM bundle of CAs whose client certificates the worker accepts."),
    )
    require_client_cert: bool = field(
        default=False,
        metadata=_doc("Refuse TLS clients that present no certificate signed by `client_ca`."),
    )


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    """The emulator backend's pretend devices (host memory stands in for device memory)."""

    device_count: int = field(default=1, metadata=_doc("Number of emulated devices."))
    total_memory: int = field(
        default=8 * GiB, metadata=_doc("Memory of each emulated device.", size=True)
    )
    device_name: str = field(
        default="hipr emulator", metadata=_doc("Device name the emulator reports.")
    )


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Everything ``hipr worker`` can be told; see ``config/worker.toml``."""

    listen: tuple[str, ...] = field(
        default=("tcp://127.0.0.1:18515",),
        metadata=_doc(
            "URLs to listen on, one string or a list: `tcp://HOST:PORT`, `unix:///PATH`, "
            "`tls://HOST:PORT` (SSH clients reach the worker through its Unix socket)."
        ),
    )
    backend: str = field(
        default="auto",
        metadata=_doc(
            "GPU runtime: `auto` picks `hip` or `cuda` when one loads, else the emulator.",
            choices=BACKENDS,
        ),
    )
    emulator_fallback: bool = field(
        default=True,
        metadata=_doc(
            'Whether `backend = "auto"` falls back to the emulator (with a warning) when '
            "neither `hip` nor `cuda` loads; false refuses to start instead, as on a GPU "
            "node (`--no-emulator-fallback`)."
        ),
    )
    max_frame_bytes: int = field(
        default=64 * MiB,
        metadata=_doc(
            "Largest frame the worker accepts; bulk data travels in chunks of at most this size.",
            size=True,
        ),
    )
    pinned_payload_bytes: int = field(
        default=64 * MiB,
        metadata=_doc(
            "Page-locked host memory (GPU backends) that large uploads are received into and "
            "downloads are filled from, so the runtime DMAs straight to and from it instead "
            "of first copying through a pinned buffer of its own; allocated at start in "
            "chunk-sized buffers, shared by all connections (one that finds none free uses "
            'pageable memory); with `isolation = "process"` each tenant\'s worker pins its '
            "own. 0: none.",
            size=True,
            zero_ok=True,
        ),
    )
    data_links: int = field(
        default=4,
        metadata=_doc(
            "Data links a session may attach (protocol 1.4): further connections that carry "
            "the chunks of one large upload at once, each received by a thread of its own, "
            "so that an upload is not bound by one thread's socket reads. Offered on tcp "
            "and unix links, not TLS. 0: none.",
            zero_ok=True,
        ),
    )
    max_clients: int | None = field(
        default=None,
        metadata=_doc("Most connections served at once, all tenants together; unset: no limit."),
    )
    max_hello_bytes: int = field(
        default=64 * KiB,
        metadata=_doc(
            "Largest frame accepted before a connection has authenticated (its HELLO or "
            "RESUME): a larger one is refused from its header, before its payload is read "
            "(`max_frame_bytes` if that is smaller).",
            size=True,
        ),
    )
    max_cbor_items: int = field(
        default=65536,
        metadata=_doc(
            "Most CBOR items (maps, arrays, strings, numbers ...) one frame's arguments may "
            "hold; a frame over it is refused before it is decoded and its connection "
            "closed. The largest request the worker knows holds about 8,200."
        ),
    )
    handshake_timeout: float = field(
        default=5.0,
        metadata=_doc("Seconds a new connection has to send its HELLO (or RESUME)."),
    )
    max_pending_handshakes: int | None = field(
        default=None,
        metadata=_doc(
            "Most connections that have not finished their handshake at once, all sources "
            "together; more are closed at once. Unset: a quarter of the open-file limit."
        ),
    )
    max_pending_handshakes_per_peer: int | None = field(
        default=None,
        metadata=_doc(
            "Most unfinished handshakes from one source address (one uid on a Unix socket); "
            "more are closed at once. Unset: a sixteenth of `max_pending_handshakes`, "
            "at least 8."
        ),
    )
    auth_failure_delay: float = field(
        default=0.05,
        metadata=_doc(
            "Seconds a refused HELLO from a source waits for its answer after that "
            "source's first failure; it doubles with each further failure, up to "
            "`auth_failure_max_delay`, and halves for every ten seconds without one. "
            "Other sources are not slowed. 0: no delay."
        ),
    )
    auth_failure_max_delay: float = field(
        default=2.0,
        metadata=_doc("The longest delay of a refused HELLO (see `auth_failure_delay`)."),
    )
    frame_timeout: float = field(
        default=30.0,
        metadata=_doc(
            "Seconds within which a frame, once begun, must have arrived whole (plus one "
            "second for every MiB of its payload); a link that drips bytes slower is closed."
        ),
    )
    heartbeat_interval: float = field(
        default=5.0, metadata=_doc("Seconds of silence on a link before a PING is sent.")
    )
    heartbeat_timeout: float = field(
        default=15.0,
        metadata=_doc("Seconds of silence after which a link is dead; above `heartbeat_interval`."),
    )
    resume_grace: float = field(
        default=30.0,
        metadata=_doc(
            "Seconds a session whose link died is kept for its client to resume; "
            "0 frees it at once."
        ),
    )
    spin_wait: float | None = field(
        default=None,
        metadata=_doc(
            "Seconds the event loop keeps polling without sleeping after a request "
            "arrives or a reply leaves, and that a synchronize polls for running work "
            "before it blocks (CUDA's spin scheduling for the worker: answers tens of µs "
            "sooner on a virtual machine, for one busy core while clients are active). "
            '"auto": 200 µs on a machine with 4 or more usable CPUs (its affinity and '
            "cgroup quota), else 0, as the sync client spins. 0: never spin.",
            auto=True,
        ),
    )
    shutdown_timeout: float = field(
        default=10.0,
        metadata=_doc(
            "Seconds SIGTERM waits for sessions to finish before closing them. The worker "
            "exits at most 5 s later whatever still runs (a kernel that never ends "
            "included): tenant processes are killed, and the exit status is 124."
        ),
    )
    runaway_grace: float = field(
        default=5.0,
        metadata=_doc(
            "Seconds GPU work may run on after its session ended (goodbye, or a dropped "
            "link past `resume_grace`) before the worker stops it by ending the tenant's "
            'process (`isolation = "process"`); a shared process (`none`) can only report '
            "it, in its log, metrics and status."
        ),
    )
    tenants_file: Path | None = field(
        default=None,
        metadata=_doc(
            "TOML file of tenants, token hashes and quotas; unset: one anonymous tenant, no tokens."
        ),
    )
    isolation: str = field(
        default="auto",
        metadata=_doc(
            "`auto`: `process` when the tenants file names more than one tenant, else "
            "`none`. `process`: each tenant's sessions run in a worker process of their "
            "own, so one tenant's kernels cannot read another's memory, and a kernel "
            "fault (illegal address) loses only that tenant's sessions while its process "
            "restarts. `session`: a process per session, so a fault loses only the "
            "faulting session (costs a process start, ~0.5-1 s, and its memory per "
            "session; see docs/operations.md). `none`: all sessions share one process "
            "and GPU context: any tenant's kernel can read every other tenant's device "
            "memory, and one fault fails every session on the device (the worker then "
            "rebuilds the context); with several tenants the worker warns at start, in "
            "`hipr status` and in `/metrics`.",
            choices=ISOLATION_MODES,
        ),
    )
    allow_plaintext_tokens: bool = field(
        default=False,
        metadata=_doc("Allow bearer tokens over plain `tcp://` on a non-loopback address."),
    )
    admin_token_sha256: str | None = field(
        default=None,
        metadata=_doc("SHA-256 (hex) of the token that admin calls (`hipr status`) must present."),
    )
    metrics_listen: str | None = field(
        default=None,
        metadata=_doc("`HOST:PORT` of the Prometheus metrics endpoint; unset: no metrics."),
    )
    log_level: str = field(
        default="info",
        metadata=_doc(
            "Least severe level logged (`HIPR_LOG_LEVEL` overrides).", choices=LOG_LEVELS
        ),
    )
    log_format: str = field(
        default="auto",
        metadata=_doc(
            "`console` (readable), `json` (one object a line), or `auto`: console "
            "on a terminal, else JSON.",
            choices=LOG_FORMATS,
        ),
    )
    log_levels: dict[str, str] = field(
        default_factory=dict,
        metadata=_doc(
            "Levels of single loggers and their children, e.g. "
            '`{"hipr.connection" = "debug", "hipr.transports" = "warning"}`.',
            choices=LOG_LEVELS,
        ),
    )
    tls: TlsConfig = field(
        default_factory=TlsConfig, metadata=_doc("TLS certificates (`[tls]` table).")
    )
    emulator: EmulatorConfig = field(
        default_factory=EmulatorConfig,
        metadata=_doc("Emulator backend settings (`[emulator]` table)."),
    )


# --- loading ------------------------------------------------------------------------


def load_config(
    path: Path | str | None,
    overrides: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> WorkerConfig:
    """Read the worker configuration from the TOML file ``path`` (``None``: defaults only).

    ``overrides`` (typically command-line flags) win over ``environ`` (``HIPR_LOG_LEVEL``,
    ``HIPR_LOG_FORMAT``; only read when given), which win over the file. Override keys
    may be dotted (``"tls.certfile"``) or nested mappings; ``None`` values are ignored
    so that absent flags can be passed as they are. Relative paths are resolved against
    the file's directory, or the working directory for overrides.

    Raises :class:`ConfigError` naming the source and the key for an unknown key, a
    wrong type or a bad value.
    """
    raw: dict[str, Any] = {}
    origins: dict[str, tuple[str, Path]] = {}
    if path is not None:
        path = Path(path)
        source = str(path)
        try:
            with path.open("rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError("no such file", source=source) from None
        except OSError as e:
            raise ConfigError(f"cannot read: {e.strerror or e}", source=source) from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"invalid TOML: {e}", source=source) from None
        _merge(raw, origins, data, source, path.parent, "")
    for var, key in ENV_KEYS.items():
        if environ is not None and environ.get(var):
            _merge(raw, origins, {key: environ[var]}, var, Path.cwd(), "")
    if overrides:
        _merge(raw, origins, _nest(overrides), "command line", Path.cwd(), "")
    default_source = str(path) if path is not None else "configuration"
    builder = _Builder(origins, default_source)
    config: WorkerConfig = builder.build(WorkerConfig, raw, "")
    _check(config, builder)
    return config


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Turn dotted keys into nested tables, dropping ``None`` values."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        if value is None:
            continue
        if isinstance(value, Mapping):
            value = _nest(value)
            if not value:
                continue
        parts = key.split(".")
        table = out
        for part in parts[:-1]:
            if not isinstance(table.get(part), dict):
                table[part] = {}
            table = table[part]
        if isinstance(value, dict) and isinstance(table.get(parts[-1]), dict):
            table[parts[-1]].update(value)
        else:
            table[parts[-1]] = value
    return out


def _merge(
    raw: dict[str, Any],
    origins: dict[str, tuple[str, Path]],
    data: Mapping[str, Any],
    source: str,
    base_dir: Path,
    prefix: str,
) -> None:
    """Lay ``data`` over ``raw``, remembering where each key came from."""
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and isinstance(raw.get(key, {}), dict):
            origins.setdefault(dotted, (source, base_dir))
            _merge(raw.setdefault(key, {}), origins, value, source, base_dir, dotted + ".")
        else:
            raw[key] = value
            origins[dotted] = (source, base_dir)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """``(X, True)`` for ``X | None``, ``(tp, False)`` otherwise."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


class _Builder:
    """Builds the dataclasses from merged raw tables, reporting errors at their source."""

    def __init__(self, origins: dict[str, tuple[str, Path]], default_source: str) -> None:
        self.origins = origins
        self.default_source = default_source

    def source(self, key: str) -> str:
        origin = self.origins.get(key)
        return origin[0] if origin else self.default_source

    def error(self, key: str, message: str, *, label: str | None = None) -> ConfigError:
        """An error about ``key``, at the source it came from; ``label`` names it instead."""
        return ConfigError(message, source=self.source(key), key=label or key)

    def build(self, cls: type[Any], table: Any, prefix: str) -> Any:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if not isinstance(table, Mapping):
            raise self.error(prefix.rstrip("."), f"expected a table, got {_describe(table)}")
        for key in table:
            if key not in fields:
                dotted = f"{prefix}{key}"
                known = ", ".join(fields)
                raise ConfigError(
                    f"unknown key {dotted!r} (known: {known})", source=self.source(dotted)
                )
        hints = _hints(cls)
        values: dict[str, Any] = {}
        for name, f in fields.items():
            if name not in table:
                continue
            dotted = f"{prefix}{name}"
            values[name] = self.convert(dotted, hints[name], f.metadata, table[name])
        return cls(**values)

    def convert(self, key: str, tp: Any, meta: Mapping[str, Any], value: Any) -> Any:
        inner, _optional = _unwrap_optional(tp)
        if meta.get("auto") and isinstance(value, str):
            if value.strip().lower() != "auto":
                raise self.error(key, f'expected a number or "auto", got {_describe(value)}')
            return None
        if dataclasses.is_dataclass(inner) and isinstance(inner, type):
            return self.build(inner, value, key + ".")
        if meta.get("size"):
            try:
                size = parse_size(value)
            except ValueError as e:
                raise self.error(key, f"{e}") from None
            if size < 0 or (size == 0 and not meta.get("zero_ok")):
                raise self.error(key, f"must be positive, got {value!r}")
            return size
        if inner is bool:
            if not isinstance(value, bool):
                raise self.error(key, f"expected true or false, got {_describe(value)}")
            return value
        if inner is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(key, f"expected an integer, got {_describe(value)}")
            return value
        if inner is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self.error(key, f"expected a number, got {_describe(value)}")
            if not math.isfinite(value):
                raise self.error(key, f"expected a finite number, got {value!r}")
            return float(value)
        if inner is str:
            if not isinstance(value, str):
                raise self.error(key, f"expected a string, got {_describe(value)}")
            choices = meta.get("choices")
            if choices:
                value = value.lower()
                if value not in choices:
                    raise self.error(key, f"expected one of {', '.join(choices)}, got {value!r}")
            return value
        if inner is Path:
            if not isinstance(value, str | os.PathLike) or not os.fspath(value):
                raise self.error(key, f"expected a path, got {_describe(value)}")
            p = Path(value).expanduser()
            if not p.is_absolute():
                base = self.origins.get(key, ("", Path.cwd()))[1]
                p = base.absolute() / p
            return Path(os.path.normpath(p))
        if typing.get_origin(inner) is dict:
            if not isinstance(value, Mapping):
                raise self.error(key, f"expected a table, got {_describe(value)}")
            choices = meta.get("choices") or ()
            table: dict[str, str] = {}
            for name, item in value.items():
                if not isinstance(item, str) or (choices and item.lower() not in choices):
                    wanted = f"one of {', '.join(choices)}" if choices else "a string"
                    raise self.error(
                        key, f"expected {wanted}, got {_describe(item)}", label=f"{key}.{name}"
                    )
                table[name] = item.lower()
            return table
        if typing.get_origin(inner) is tuple:
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list | tuple):
                raise self.error(key, f"expected a list of strings, got {_describe(value)}")
            for i, item in enumerate(items):
                if not isinstance(item, str) or not item.strip():
                    raise self.error(
                        key,
                        f"expected a non-empty string, got {_describe(item)}",
                        label=f"{key}[{i}]",
                    )
            return tuple(items)
        raise TypeError(f"config schema: no converter for {key}: {tp!r}")  # pragma: no cover


def _describe(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }
    kind = names.get(type(value), type(value).__name__)
    return f"{kind} ({value!r:.60})"


def _check(config: WorkerConfig, b: _Builder) -> None:
    """Rules that involve a value's meaning or several keys."""
    if not config.listen:
        raise b.error("listen", "needs at least one URL")
    for i, url in enumerate(config.listen):
        if not _URL_RE.match(url):
            raise b.error(
                "listen",
                f"{url!r} is not a URL (write e.g. tcp://127.0.0.1:18515 or "
                "unix:///run/hipr/worker.sock)",
                label=f"listen[{i}]",
            )
    if not 0 <= config.data_links <= MAX_DATA_LINKS:
        raise b.error(
            "data_links", f"must be between 0 and {MAX_DATA_LINKS}, got {config.data_links}"
        )
    for name in ("max_clients", "max_pending_handshakes", "max_pending_handshakes_per_peer"):
        value = getattr(config, name)
        if value is not None and value <= 0:
            raise b.error(name, f"must be positive, got {value}")
    if config.max_cbor_items <= 0:
        raise b.error("max_cbor_items", f"must be positive, got {config.max_cbor_items}")
    for name in ("auth_failure_delay", "auth_failure_max_delay"):
        if getattr(config, name) < 0:
            raise b.error(name, f"cannot be negative, got {getattr(config, name)}")
    for name in (
        "heartbeat_interval",
        "heartbeat_timeout",
        "shutdown_timeout",
        "handshake_timeout",
        "frame_timeout",
        "runaway_grace",
    ):
        if getattr(config, name) <= 0:
            raise b.error(name, f"must be positive, got {getattr(config, name)}")
    if config.spin_wait is not None and not 0 <= config.spin_wait <= MAX_SPIN_WAIT:
        raise b.error(
            "spin_wait", f"must be between 0 and {MAX_SPIN_WAIT:g} s, got {config.spin_wait}"
        )
    if config.resume_grace < 0:
        raise b.error("resume_grace", f"cannot be negative, got {config.resume_grace}")
    if config.heartbeat_timeout <= config.heartbeat_interval:
        key = "heartbeat_timeout" if "heartbeat_timeout" in b.origins else "heartbeat_interval"
        raise b.error(
            key,
            f"heartbeat_timeout ({config.heartbeat_timeout:g}) must be greater than "
            f"heartbeat_interval ({config.heartbeat_interval:g})",
        )
    if config.admin_token_sha256 is not None and not _SHA256_RE.match(config.admin_token_sha256):
        raise b.error("admin_token_sha256", "expected 64 lowercase hex digits (a SHA-256)")
    if config.metrics_listen is not None:
        _check_host_port(config.metrics_listen, "metrics_listen", b)
    tls = config.tls
    if (tls.certfile is None) != (tls.keyfile is None):
        missing = "tls.keyfile" if tls.keyfile is None else "tls.certfile"
        raise b.error(missing, "tls.certfile and tls.keyfile go together: set both or neither")
    if tls.require_client_cert and tls.client_ca is None:
        raise b.error("tls.client_ca", "must be set when tls.require_client_cert is true")
    if config.emulator.device_count <= 0:
        raise b.error(
            "emulator.device_count", f"must be positive, got {config.emulator.device_count}"
        )


def _check_host_port(value: str, key: str, b: _Builder) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise b.error(key, f"expected HOST:PORT, e.g. 127.0.0.1:9464, got {value!r}")


# --- reference documentation --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """One configuration key as documented: dotted name, type, default and doc."""

    key: str
    type: str
    default: str
    doc: str


def iter_keys(cls: type[Any] = WorkerConfig, prefix: str = "") -> Iterator[KeyInfo]:
    """Every leaf key of the schema, in declaration order, tables after their parent."""
    hints = _hints(cls)
    nested: list[tuple[str, type[Any]]] = []
    for f in dataclasses.fields(cls):
        tp, optional = _unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            nested.append((f"{prefix}{f.name}.", tp))
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        yield KeyInfo(
            key=f"{prefix}{f.name}",
            type=_type_name(tp, f.metadata, optional),
            default=_default_text(default, f.metadata),
            doc=str(f.metadata.get("doc", "")),
        )
    for pre, sub in nested:
        yield from iter_keys(sub, pre)


def _type_name(tp: Any, meta: Mapping[str, Any], optional: bool) -> str:
    if meta.get("auto"):
        return '{} or `"auto"`'.format({float: "number", int: "integer"}[tp])
    if meta.get("size"):
        name = "size"
    elif typing.get_origin(tp) is dict:
        choices = meta.get("choices", ())
        name = "table of " + (" \\| ".join(f"`{c}`" for c in choices) if choices else "strings")
    elif meta.get("choices"):
        name = " \\| ".join(f"`{c}`" for c in meta["choices"])
    elif typing.get_origin(tp) is tuple:
        name = "list of strings"
    else:
        name = {bool: "bool", int: "integer", float: "number", str: "string", Path: "path"}[tp]
    return f"{name} (optional)" if optional else name


def _default_text(value: Any, meta: Mapping[str, Any]) -> str:
    if value is None and meta.get("auto"):
        return '`"auto"`'
    if value is None:
        return "unset"
    if meta.get("size"):
        return f'`"{format_size(value)}"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        return "`[" + ", ".join(f'"{v}"' for v in value) + "]`"
    if isinstance(value, dict):
        return "`{" + ", ".join(f'"{k}" = "{v}"' for k, v in value.items()) + "}`"
    return f"`{value!r}`"


def spin_seconds(config: WorkerConfig) -> float:
    """The event loop's spin window in force: ``spin_wait``, or the automatic choice
    (:func:`hipr.cpus.auto_spin_wait`) where it is ``"auto"``."""
    return auto_spin_wait() if config.spin_wait is None else config.spin_wait


def config_reference_markdown() -> str:
    """The configuration reference: a Markdown table of every key, from the schema."""
    lines = [
        "| Key | Type | Default | Description |",
        "|---|---|---|---|",
    ]
    for k in iter_keys():
        doc = k.doc.replace("|", "\\|")
        lines.append(f"| `{k.key}` | {k.type} | {k.default} | {doc} |")
    return "\n".join(lines) + "\n"
