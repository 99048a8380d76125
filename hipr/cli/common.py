"""What the ``hipr`` subcommands share: exit codes, argument types, client options,
connecting from parsed arguments and printing JSON or sizes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from enum import IntEnum
from typing import Any

from hipr._version import __version__
from hipr.protocol import PROTOCOL_VERSION, version_text


class ExitCode(IntEnum):
    """The ``hipr`` command's exit codes, the one source of ``docs/cli.md``'s table.

    The ``#:`` comment above each member is its documentation there."""

    #: Success.
    OK = 0
    #: The worker answered with a HIP error, or the worker failed while running.
    HIP_ERROR = 1
    #: Usage or configuration error: a bad flag, a malformed URL, a bad config file.
    USAGE = 2
    #: Connection error: refused, reset, timed out, session lost, not a hipr worker.
    CONNECTION = 3
    #: The worker refused the credentials: token missing, wrong or revoked.
    AUTH = 4
    #: ``hipr worker`` could not listen: the address is already in use.
    ADDRESS_IN_USE = 5
    #: Interrupted (Ctrl-C).
    INTERRUPTED = 130


EXIT_OK = ExitCode.OK
EXIT_HIP_ERROR = ExitCode.HIP_ERROR
EXIT_USAGE = ExitCode.USAGE
EXIT_CONNECTION = ExitCode.CONNECTION
EXIT_AUTH = ExitCode.AUTH
EXIT_ADDRESS_IN_USE = ExitCode.ADDRESS_IN_USE
EXIT_INTERRUPTED = ExitCode.INTERRUPTED


def version_string() -> str:
    """``hipr 0.1.0 (protocol 1.0)``."""
    return f"hipr {__version__} (protocol {version_text(PROTOCOL_VERSION)})"


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return x


def add_client_options(p: argparse.ArgumentParser, several: bool = False) -> None:
    if several:
        p.add_argument(
            "url",
            nargs="+",
            help="worker URL, e.g. tcp://gpu-node:18515 or unix:///run/hipr.sock; several "
            "(or one with commas, as `hipr workers` prints) give one table for all",
        )
    else:
        p.add_argument("url", help="worker URL, e.g. tcp://gpu-node:18515 or unix:///run/hipr.sock")
    tokens = p.add_mutually_exclusive_group()
    tokens.add_argument(
        "--token",
        help="tenant token (prefer --token-file or the HIPR_TOKEN environment variable: "
        "a command line is visible to other users)",
    )
    tokens.add_argument(
        "--token-file",
        metavar="FILE",
        help="read the tenant token from FILE (its first line)",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        metavar="SECONDS",
        help="give up connecting after this long (default: the client's)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def token_from_args(args: argparse.Namespace) -> str | None:
    """The token of ``--token`` or ``--token-file``; None leaves ``$HIPR_TOKEN`` to the client.

    An unreadable or empty file is a usage error naming the file."""
    from hipr.errors import UsageError

    path = getattr(args, "token_file", None)
    if path is None:
        token: str | None = getattr(args, "token", None)
        return token
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            token = f.readline().strip()
    except OSError as exc:
        raise UsageError(message=f"--token-file {path}: {exc.strerror or exc}") from None
    if not token:
        raise UsageError(message=f"--token-file {path}: the file is empty")
    return token


def connect_from_args(args: argparse.Namespace) -> Any:
    import hipr

    kwargs: dict[str, Any] = {}
    token = token_from_args(args)
    if token is not None:
        kwargs["token"] = token
    if args.timeout is not None:
        kwargs["timeout"] = args.timeout
    return hipr.connect(args.url, **kwargs)  # type: ignore[attr-defined]


def as_dict(obj: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, dict):
        return dict(obj)
    to_wire = getattr(obj, "to_wire", None)
    if callable(to_wire):
        return dict(to_wire())
    return dict(vars(obj))


def json_default(obj: Any) -> Any:
    if isinstance(obj, bytes | bytearray):
        return obj.hex()
    return str(obj)


def dump_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=json_default))


def human_size(n: int | float) -> str:
    """``8.0 GiB``, ``512 B``: sizes for people."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def human_duration(seconds: float) -> str:
    """``3d 4h``, ``2h 05m``, ``4m 10s``, ``12s``."""
    s = int(max(0.0, seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {s:02d}s"
    return f"{s}s"


def event_loop(choice: str | None) -> tuple[str, dict[str, Any]]:
    """anyio's backend name and options for ``--loop``: ``uvloop`` (the default where it
    is installed: its I/O costs a fraction of the standard loop's per request),
    ``asyncio`` (the standard library's loop) or ``trio``."""
    if choice is None:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            choice = "asyncio"
        else:
            choice = "uvloop"
    if choice == "trio":
        return "trio", {}
    return "asyncio", {"use_uvloop": choice == "uvloop"}
