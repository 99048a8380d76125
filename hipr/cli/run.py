"""``hipr run -- CMD ARGS``: run a program with the native proxy in front of it, so that its
HIP calls (``libamdhip64.so``, ``libhiprtc.so``) or its CUDA driver calls (``libcuda.so.1``,
``--api cuda``) go to a worker."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hipr.cli.common import EXIT_HIP_ERROR, EXIT_USAGE
from hipr.cli.proxy import ensure_built
from hipr.proxy.build import CUDA_SUBDIR, LIB_DIR

DEFAULT_URL = "tcp://127.0.0.1:18515"
#: hip-python looks in ROCm's install (ROCM_PATH, ROCM_HOME) before the library path: a real
#: ROCm there would be loaded instead of the proxy.
_ROCM_VARIABLES = ("ROCM_PATH", "ROCM_HOME", "HIP_PATH")


def add_run_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``hipr run`` on the ``hipr`` command's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="run a HIP program against a worker through the native proxy",
        description="Runs CMD with hipr's libamdhip64.so/libhiprtc.so first on its library "
        "path and HIPR_URL/HIPR_TOKEN set, so that an unmodified HIP program (hip-python, "
        "or C/C++ using the module API) runs on the worker. Example: "
        "hipr run --url tcp://gpu-host:18515 --token-file ~/.hipr-token -- python app.py",
    )
    p.add_argument("--url", help=f"worker URL (default: $HIPR_URL, else {DEFAULT_URL})")
    p.add_argument("--token-file", type=Path, help="file holding the tenant token")
    p.add_argument(
        "--api",
        choices=("cuda", "hip"),
        help="which proxy: cuda (libcuda.so.1: CUDA programs, CuPy, PyTorch) or hip "
        "(libamdhip64.so, libhiprtc.so); default: the worker's backend (cuda for a cuda "
        "worker, else hip)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    p.set_defaults(func=cmd_run, client=False)
    return p


def proxy_environment(
    base: dict[str, str], url: str | None, token: str | None, api: str = "hip"
) -> dict[str, str]:
    """``base`` with the proxy's library path (the HIP libraries, or with ``api="cuda"``
    the folder holding libcuda.so.1), worker URL and token."""
    env = dict(base)
    for name in _ROCM_VARIABLES:
        env.pop(name, None)
    path = env.get("LD_LIBRARY_PATH", "")
    first = LIB_DIR / CUDA_SUBDIR if api == "cuda" else LIB_DIR
    env["LD_LIBRARY_PATH"] = f"{first}:{path}" if path else str(first)
    env["HIPR_URL"] = url or env.get("HIPR_URL") or DEFAULT_URL
    if token is not None:
        env["HIPR_TOKEN"] = token
        env.pop("HIPR_TOKEN_FILE", None)
    return env


def _environment_token() -> str | None:
    """The token the proxy would send: $HIPR_TOKEN, else $HIPR_TOKEN_FILE's content."""
    token = os.environ.get("HIPR_TOKEN")
    if token:
        return token
    path = os.environ.get("HIPR_TOKEN_FILE")
    if path:
        try:
            return Path(path).read_text().strip() or None
        except OSError:
            return None  # the proxy says so itself, on the program's first call
    return None


def worker_api(url: str, token: str | None) -> str:
    """ "cuda" when the worker at ``url`` runs the cuda backend, else "hip" (also when it
    does not answer: the proxy then says so itself, on the program's first call)."""
    from hipr.client.sync import connect

    try:
        with connect(url, token=token, timeout=5) as gpu:
            backend = str(gpu.worker_info().get("backend", ""))
    except Exception as exc:  # no worker, refused token: the proxy reports it in the program
        print(f"hipr run: could not ask {url} for its backend ({exc}); using the HIP proxy "
              "(give --api cuda for CUDA programs)", file=sys.stderr)  # fmt: skip
        return "hip"
    return "cuda" if backend == "cuda" else "hip"


def cmd_run(args: argparse.Namespace) -> int:
    """``hipr run [--url URL] [--token-file F] -- CMD ARGS``: CMD's exit status."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "hipr run: give the command after --, e.g. hipr run -- python app.py", file=sys.stderr
        )
        return EXIT_USAGE
    why = ensure_built()
    if why is not None:
        print(f"hipr run: {why}", file=sys.stderr)
        return EXIT_HIP_ERROR
    token = None
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            print(f"hipr run: cannot read the token file: {exc}", file=sys.stderr)
            return EXIT_USAGE
    url = args.url or os.environ.get("HIPR_URL") or DEFAULT_URL
    api = args.api or worker_api(url, token or _environment_token())
    env = proxy_environment(dict(os.environ), args.url, token, api)
    try:
        completed = subprocess.run(command, env=env, check=False)
    except FileNotFoundError:
        print(f"hipr run: command not found: {command[0]}", file=sys.stderr)
        return 127
    except KeyboardInterrupt:
        return 130
    code = completed.returncode
    return 128 - code if code < 0 else code
