"""``hipr proxy``: where the native proxy libraries are, and building them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hipr.cli.common import EXIT_HIP_ERROR, EXIT_OK
from hipr.proxy.build import (
    LIB_DIR,
    BuildError,
    build,
    is_built,
    is_current,
    missing_prerequisites,
)


def add_proxy_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``hipr proxy`` on the ``hipr`` command's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "proxy",
        help="the native proxy libraries (libamdhip64.so, libhiprtc.so)",
        description="Unmodified HIP programs load hipr's proxy libamdhip64.so/libhiprtc.so "
        "from this directory (`hipr run` sets the library path for you). `--path` prints "
        "it; `build` compiles the libraries (needs a C compiler and libcbor-dev).",
    )
    p.add_argument("--path", action="store_true", help="print the library directory")
    p.add_argument("action", nargs="?", choices=("build",), help="build the libraries")
    p.add_argument("--out", type=Path, help="build into this directory instead")
    p.add_argument(
        "--sanitize", action="store_true", help="build with AddressSanitizer and UBSan (tests)"
    )
    p.set_defaults(func=cmd_proxy, client=False)
    return p


def ensure_built(quiet: bool = False) -> str | None:
    """Build the libraries if they are missing or older than their sources; None when
    they are there, else why not."""
    if is_current():
        return None
    why = missing_prerequisites()
    if why is not None:
        if is_built():
            # Libraries brought here without a toolchain (a copied lib/ folder): use them.
            print(f"hipr: using {LIB_DIR} as found (cannot rebuild: {why})", file=sys.stderr)
            return None
        return f"the native proxy is not built: {why}"
    if not quiet:
        print(f"hipr: building the native proxy into {LIB_DIR}", file=sys.stderr)
    try:
        build()
    except BuildError as exc:
        return f"the native proxy could not be built: {exc}"
    return None


def cmd_proxy(args: argparse.Namespace) -> int:
    """``hipr proxy [--path] [build]``."""
    if args.action == "build":
        try:
            built = build(args.out, sanitize=args.sanitize)
        except BuildError as exc:
            print(f"hipr proxy build: {exc}", file=sys.stderr)
            return EXIT_HIP_ERROR
        for library in built.libraries:
            print(library)
        return EXIT_OK
    print(LIB_DIR)
    if not is_built():
        why = missing_prerequisites()
        hint = why or "run `hipr proxy build`"
        print(f"hipr: the libraries are not built there yet: {hint}", file=sys.stderr)
        return EXIT_HIP_ERROR
    return EXIT_OK
