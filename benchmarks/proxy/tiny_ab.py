"""PyTorch's tiny op + synchronize through the CUDA proxy, against workers that differ
only in their environment, alternating, in one run: the host's spread between two runs
of the same tree (10-40 µs on the H200 hosts) is larger than most changes of the
worker's request path, so a change is judged on medians of alternating rounds, never
on two separate runs.

    python -m benchmarks.proxy.tiny_ab [--rounds 8] [--worker LABEL[:VAR=VALUE,...][@CPUS]]...
        [--client-cpus CPUS] [--tree LABEL=DIR] [--op tiny|each|item]
        [--copies-first LABEL [--copies-mib 256]] [--lib LABEL=DIR]

Default workers: ``native`` (the native launch-and-wait) and
``python:HIPR_NATIVE_LAUNCH=0`` (the same tree's Python path). Each round runs
``torch_ops.py --only tiny`` (400 timed ``add_`` + synchronize, median) through every
worker in turn; the blocking-socket echo floor is measured between rounds. ``@CPUS``
pins a worker with taskset (``@2`` or ``@2-3``), ``--client-cpus`` the PyTorch clients;
``--tree LABEL=DIR`` runs that worker from another checkout's ``hipr`` (its folder as the
worker's working directory: ``python -m hipr`` imports from there first). ``--op each``
compares the time of each of 1,000 ``add_`` then a synchronize instead, ``--op item``
that of ``t.item()``. ``--copies-first LABEL`` has that worker serve a PyTorch program's
copies of ``--copies-mib`` MiB (pageable and pinned, each way) just before each of its rounds (as
``torch_compare`` runs its copies on the worker before the tiny op is timed), so a
worker fresh from large copies is compared with one that made none. ``--lib LABEL=DIR``
runs that label's PyTorch clients through the proxy libraries in DIR (``hipr proxy build
--out DIR`` of another tree) instead of this tree's: a change of the proxy compared."""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path

from benchmarks.proxy.compare import floors
from benchmarks.proxy.torch_compare import num, proxied_env, proxy_dir, run_torch, worker

#: ``--op``: torch_ops.py's ``--only`` name, the figure's key, and its words.
_OPS = {
    "tiny": ("tiny", "tiny_op_sync_us", "tiny add_ + synchronize"),
    "each": ("op_of_1000", "op_of_1000_us", "each of 1,000 add_ then synchronize"),
    "item": ("item", "item_us", "item() (one 4-byte copy back)"),
}


def _parse(spec: str) -> tuple[str, dict[str, str], str | None]:
    spec, _, cpus = spec.partition("@")
    label, _, settings = spec.partition(":")
    env = dict(item.split("=", 1) for item in settings.split(",") if item)
    return label, env, cpus or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy.tiny_ab")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--python", default=sys.executable, help="the Python with PyTorch")
    parser.add_argument("--worker", action="append", default=[], metavar="LABEL[:VAR=V,...][@CPUS]")
    parser.add_argument("--client-cpus", help="pin the PyTorch clients (taskset -c)")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR")
    parser.add_argument(
        "--copies-first", action="append", default=[], metavar="LABEL",
        help="this worker serves large copies before each of its rounds",
    )  # fmt: skip
    parser.add_argument("--copies-mib", type=int, default=256)
    parser.add_argument("--lib", action="append", default=[], metavar="LABEL=DIR")
    parser.add_argument(
        "--op", choices=sorted(_OPS), default="tiny", help="the PyTorch figure compared"
    )
    args = parser.parse_args(argv)
    only, key, what = _OPS[args.op]
    specs = [_parse(w) for w in (args.worker or ["native", "python:HIPR_NATIVE_LAUNCH=0"])]
    libs = {label: Path(d).resolve() for label, _, d in (t.partition("=") for t in args.lib)}
    lib = proxy_dir()
    seen: dict[str, list[float]] = {label: [] for label, _, _ in specs}
    python = args.python
    client = ["taskset", "-c", args.client_cpus, python] if args.client_cpus else None
    echoes: list[float] = []
    with ExitStack() as stack:
        trees = {label: Path(d).resolve() for label, _, d in (t.partition("=") for t in args.tree)}
        urls = {
            label: stack.enter_context(worker(args.backend, env, cpus, trees.get(label)))
            for label, env, cpus in specs
        }
        for round_ in range(args.rounds):
            echoes.append(floors(1 << 20).echo_median * 1e6)
            order = specs if round_ % 2 == 0 else specs[::-1]
            for label, _, _ in order:
                if label in args.copies_first:
                    copies = run_torch(
                        python, proxied_env(urls[label], libs.get(label, lib)), args.copies_mib,
                        "h2d,d2h", client,
                    )  # fmt: skip
                    if num(copies.get("h2d_pageable_GBps")) is None:
                        print(f"round {round_}: {label}: copies {copies}", flush=True)
                env = proxied_env(urls[label], libs.get(label, lib))
                result = run_torch(python, env, 0, only, client)
                value = num(result.get(key))
                if value is None:
                    print(f"round {round_}: {label}: {result}", flush=True)
                    continue
                seen[label].append(value)
            print(f"round {round_}: " + ", ".join(
                f"{label} {seen[label][-1]:.1f}" for label, _, _ in specs if seen[label]
            ) + f" µs (echo {echoes[-1]:.1f})", flush=True)  # fmt: skip
    print(f"echo floor: median {statistics.median(echoes):.1f} µs over {len(echoes)}")
    for label, values in seen.items():
        if values:
            print(
                f"{label}: {what}, median of {len(values)} rounds "
                f"{statistics.median(values):.1f} µs (min {min(values):.1f}, "
                f"max {max(values):.1f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
