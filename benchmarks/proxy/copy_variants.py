"""PyTorch's 256 MiB host-to-device copy through the CUDA proxy in five forms, alternating
in one process: whether a form (pinned or pageable memory, blocking or not, a device or a
stream synchronize) is slower, or only the moment it was measured.

    python -m benchmarks.proxy.copy_variants [--backend cuda] [--mib 256] [--rounds 5]
        [--trace]

``torch_compare`` measures each copy row once after the other (three timed copies each),
so the host's drift over a run lands on whichever row came last. Here every round runs
each form once, and each form's median over the rounds is printed; ``--trace`` adds one
round under ``HIPR_PROXY_TRACE=1`` with the driver calls each form made. A worker of
``--backend`` is started on a unix socket (``torch_compare.worker_process``). A benchmark:
it reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from benchmarks.proxy.torch_compare import proxied_env, proxy_dir, worker_process

CLIENT = r"""
import statistics, sys, time, torch
size, rounds = int(sys.argv[1]), int(sys.argv[2])
host = torch.full((size,), 7, dtype=torch.uint8)
pinned = torch.full((size,), 9, dtype=torch.uint8).pin_memory()
dev = torch.empty(size, dtype=torch.uint8, device="cuda")
stream = torch.cuda.current_stream()
forms = {
    "pageable, blocking, device sync": (lambda: dev.copy_(host), torch.cuda.synchronize),
    "pinned, non_blocking, device sync": (
        lambda: dev.copy_(pinned, non_blocking=True), torch.cuda.synchronize),
    "pinned, non_blocking, stream sync": (
        lambda: dev.copy_(pinned, non_blocking=True), stream.synchronize),
    "pinned, blocking, device sync": (lambda: dev.copy_(pinned), torch.cuda.synchronize),
    "pageable, non_blocking, device sync": (
        lambda: dev.copy_(host, non_blocking=True), torch.cuda.synchronize),
}
times = {name: [] for name in forms}
for copy, sync in forms.values():
    copy(); sync()
for _ in range(rounds):
    for name, (copy, sync) in forms.items():
        print("== " + name, file=sys.stderr, flush=True)
        start = time.perf_counter(); copy(); sync()
        times[name].append(time.perf_counter() - start)
for name, spent in times.items():
    print(f"{name:38} {size / statistics.median(spent) / 1e9:5.2f} GB/s "
          f"(median of {len(spent)}; {size / max(spent) / 1e9:.2f}-{size / min(spent) / 1e9:.2f})",
          flush=True)
"""


def main(argv: list[str] | None = None) -> int:
    """Run the comparison (module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--python", default=sys.executable, help="the Python with PyTorch")
    parser.add_argument("--trace", action="store_true", help="one round's driver calls")
    args = parser.parse_args(argv)
    size = args.mib << 20
    with worker_process(args.backend) as (url, _):
        env = proxied_env(url, proxy_dir())
        subprocess.run(
            [args.python, "-c", CLIENT, str(size), str(args.rounds)], env=env, check=True
        )
        if args.trace:
            traced = subprocess.run(
                [args.python, "-c", CLIENT, str(size), "1"],
                env={**env, "HIPR_PROXY_TRACE": "1"}, capture_output=True, text=True,
            )  # fmt: skip
            lines = traced.stderr.splitlines()
            first = next((i for i, line in enumerate(lines) if line.startswith("== ")), 0)
            print("-- one round's driver calls (HIPR_PROXY_TRACE=1):")
            print("\n".join(lines[first:]))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
