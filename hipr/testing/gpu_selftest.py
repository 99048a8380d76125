"""Exercise one of hipr's backends directly, no worker involved: the GPU self-test.

    python -m hipr.testing.gpu_selftest [--backend cuda|hip|emulator] [--device N] [--small]

Prints PASS/FAIL per case, and N/A for a case the backend cannot run (the emulator
compiles no source, for one), naming what it lacks; exits non-zero if any case failed.
It uses only the backend layer of hipr (:func:`hipr.backends.load_backend`,
:mod:`hipr.errors`, :mod:`hipr.kernels`), never the client or the worker. Written for a
real GPU (``cuda``, the default); ``tests/backends/test_gpu_selftest.py`` runs every
case the emulator can run on each CI machine, with ``--small`` sizes.

An illegal address poisons a CUDA context for good, so that case runs last and in a
child process of its own.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
import traceback
from collections.abc import Sequence

import numpy as np

from hipr.backends import BackendUnavailable, load_backend
from hipr.backends.interface import Backend
from hipr.testing._selftest_cases import child_illegal_address
from hipr.testing._selftest_harness import CAPABILITIES, CASES, CaseSpec, Ctx, Sizes

__all__ = ["CASES", "main", "run_cases"]


def run_cases(ctx: Ctx, cases: Sequence[CaseSpec] = CASES) -> tuple[list[str], list[str]]:
    """Run ``cases`` in order, printing PASS, FAIL (with the traceback) or N/A for each;
    the names of the failed cases and of those the backend cannot run."""
    offered = CAPABILITIES[ctx.name]
    failed: list[str] = []
    not_run: list[str] = []
    for spec in cases:
        missing = spec.needs - offered
        if missing:
            not_run.append(spec.name)
            print(
                f"N/A   {spec.name}  (the {ctx.name} backend has no {', '.join(sorted(missing))})"
            )
            continue
        t0 = time.perf_counter()
        try:
            spec.run(ctx)
        except Exception:
            failed.append(spec.name)
            print(f"FAIL  {spec.name}")
            print("    " + traceback.format_exc().rstrip().replace("\n", "\n    "))
        else:
            print(f"PASS  {spec.name}  ({time.perf_counter() - t0:.2f} s)")
        sys.stdout.flush()
    return failed, not_run


def _versions(name: str) -> str:
    """The libraries the backend runs on, for the report's head."""
    parts = [f"python {platform.python_version()}", f"numpy {np.__version__}"]
    if name == "cuda":
        try:
            import cuda.bindings  # type: ignore[import-not-found,import-untyped,unused-ignore]

            parts.append(f"cuda-bindings {getattr(cuda.bindings, '__version__', '?')}")
        except ImportError:
            parts.append("cuda-bindings not importable")
    return ", ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hipr.testing.gpu_selftest``: see the module doc."""
    parser = argparse.ArgumentParser(
        prog="python -m hipr.testing.gpu_selftest", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--backend", choices=sorted(CAPABILITIES), default="cuda")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument(
        "--small", action="store_true", help="small copies and kernels (the default on emulator)"
    )
    parser.add_argument("--illegal-address-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.illegal_address_child:
        return child_illegal_address(args.backend, args.device)

    now = datetime.datetime.now(datetime.UTC)
    print(f"hipr {args.backend} backend self-test, {now:%Y-%m-%d %H:%M:%S} UTC")
    try:
        backend: Backend = load_backend(args.backend)
    except BackendUnavailable as exc:
        print(f"FAIL  {args.backend} backend unavailable: {exc}")
        return 1
    backend.bind_thread(args.device)
    props = backend.device_properties(args.device)
    print(f"device {args.device}: {props.name} ({props.arch}, {props.pci_bus_id})")
    print(_versions(args.backend))
    small = args.small or args.backend == "emulator"
    ctx = Ctx(backend, args.backend, args.device, Sizes.small() if small else Sizes())
    failed, not_run = run_cases(ctx)
    ran = len(CASES) - len(not_run)
    print(
        f"\n{ran - len(failed)} passed, {len(failed)} failed, {len(not_run)} not for this backend"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
