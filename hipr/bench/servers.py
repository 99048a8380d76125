"""The processes ``hipr bench`` starts: servers that print one JSON line once they listen
(the baseline and floor servers, the ``--local`` worker), and the settings they take."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

#: The folder holding the ``hipr`` package this process runs: a checkout, or site-packages.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def _child_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
    return env


@contextlib.contextmanager
def spawn_server(
    argv: Sequence[str], what: str, tree: Path | None = None
) -> Iterator[dict[str, Any]]:
    """Start a server process that prints one JSON line once it listens; stop it after.
    It imports the ``hipr`` this process runs (installed or not), or, given ``tree`` (a
    checkout, e.g. an older commit's for an A/B), runs in it and imports its ``hipr``."""
    proc = subprocess.Popen(
        list(argv),
        cwd=tree,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        env=_child_env(PACKAGE_ROOT if tree is None else tree),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {what} exited before listening (status {proc.wait()})")
        yield json.loads(line)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def baseline_server(loop: str, urls: Sequence[str]) -> contextlib.AbstractContextManager[Any]:
    """The baseline server (``python -m hipr.bench.baselines``) on ``loop``, at ``urls``."""
    argv = [sys.executable, "-m", "hipr.bench.baselines", "--loop", loop]
    for url in urls:
        argv += ["--listen", url]
    return spawn_server(argv, "baseline server")


def local_worker(
    loop: str, backend: str, urls: Sequence[str], spin_wait: float | None = None
) -> contextlib.AbstractContextManager[Any]:
    """The ``--local`` worker (``python -m hipr.cli.bench --serve-worker``) on ``loop`` and
    ``backend``, at ``urls``; ``spin_wait`` None leaves the worker's own default."""
    argv = [sys.executable, "-m", "hipr.cli.bench", "--serve-worker", "--loop", loop]
    argv += ["--backend", backend]
    if spin_wait is not None:
        argv += ["--spin-wait", repr(spin_wait)]
    for url in urls:
        argv += ["--listen", url]
    return spawn_server(argv, f"{backend} worker")


async def serve_worker(
    backend_name: str, urls: Sequence[str], spin_wait: float | None, settings: Mapping[str, Any]
) -> None:
    """The ``--local`` worker: serve ``urls`` on ``backend_name``, print one JSON line
    (its URLs, backend, pid and spin window) once listening, stop on SIGTERM or SIGINT."""
    import signal

    import anyio

    from hipr.worker.config import load_config
    from hipr.worker.server import Worker, load_configured_backend

    overrides: dict[str, Any] = {"listen": list(urls), "backend": backend_name}
    if spin_wait is not None:
        overrides["spin_wait"] = spin_wait
    config = load_config(None, {**overrides, **settings})
    backend = load_configured_backend(config)
    try:
        async with anyio.create_task_group() as tg:
            worker = Worker(config, backend)
            bound = await tg.start(worker.serve)
            # The pid: a caller may read the worker's CPU time from /proc; spin_wait:
            # the window in force, "auto" resolved.
            line = {
                "urls": bound,
                "backend": backend.name,
                "pid": os.getpid(),
                "spin_wait": worker.busy_poll.seconds,
            }
            print(json.dumps(line), flush=True)
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    break
    finally:
        backend.close()


def spin_setting(text: str) -> float | None:
    """A ``spin_wait`` on the command line: seconds, or ``auto`` (None: the worker's
    automatic choice)."""
    if text.strip().lower() == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r}: expected seconds or "auto"') from None


def worker_setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``, a top-level key of the worker's config: the value as TOML reads it
    (``0.005``, ``true``), else as text (``64MiB``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    try:
        parsed: Any = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return key.strip(), parsed


def default_worker_loop() -> str:
    """The loop ``hipr worker`` runs by default: uvloop where installed, else asyncio."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"
