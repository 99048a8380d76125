"""Where an unmodified PyTorch client spends its side of a tiny op + synchronize through
the CUDA proxy: the driver calls one round makes, and py-spy's native samples of the
client's main thread.

    python -m benchmarks.proxy.client_profile [--backend cuda] [--rounds 5]
        [--seconds 3] [--top 30] [--op tiny|item]

A worker of ``--backend`` on a unix socket (``torch_compare.worker_process``). Then:

1. the PyTorch client (``t.add_(1); torch.cuda.synchronize()`` in a loop, or
   ``t.item()`` with ``--op item``) under
   ``HIPR_PROXY_TRACE=1``: every driver entry point the CUDA runtime reached through
   ``cuGetProcAddress`` during ``--rounds`` rounds, after a warm-up, and how often;
2. the same client for ``--seconds`` under ``py-spy record --native`` (without
   ``--native`` where its unwinding fails): the functions the samples end in, and the
   ones they pass through, by share of samples.

Needs py-spy on the path for 2. A profile: it reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.proxy.torch_compare import proxied_env, proxy_dir, worker_process

#: ``--op``: one round of the client's loop.
OPS = {"tiny": "t.add_(1); sync()", "item": "t.item()"}

CLIENT = r"""
import os, sys, time, torch
t = torch.zeros(1, device="cuda")
sync = torch.cuda.synchronize
for _ in range(300):
    {step}
os.write(2, b"=== rounds begin\n")
for _ in range(int(sys.argv[1])):
    {step}
os.write(2, b"=== rounds end\n")
end = time.monotonic() + float(sys.argv[2])
print("looping", flush=True)
while time.monotonic() < end:
    {step}
"""


def traced_calls(client: str, env: dict[str, str], rounds: int) -> collections.Counter[str]:
    """The driver calls the client's ``rounds`` timed rounds made, by name."""
    out = subprocess.run(
        [sys.executable, "-c", client, str(rounds), "0"],
        env=dict(env, HIPR_PROXY_TRACE="1"), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = out.stderr.splitlines()
    try:
        inside = lines[lines.index("=== rounds begin") + 1 : lines.index("=== rounds end")]
    except ValueError:
        raise SystemExit(f"the client did not run: {out.stderr[-2000:]}") from None
    calls: collections.Counter[str] = collections.Counter()
    for line in inside:
        rest = line.removeprefix("hipr trace: ")
        if rest != line and " -> " in rest:  # a call and its result
            calls[rest.split(" -> ")[0].split("(")[0].strip()] += 1
    return calls


def sampled(client_source: str, env: dict[str, str], seconds: float, top: int) -> None:
    """py-spy's native samples of the looping client's main thread."""
    with tempfile.TemporaryDirectory(prefix="hipr-cp-") as tmp:
        raw = Path(tmp) / "client.txt"
        client = subprocess.Popen(
            [sys.executable, "-c", client_source, "0", str(seconds + 10)],
            env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert client.stdout is not None
            client.stdout.readline()  # "looping": past the start and the warm-up
            for native in (["--native"], []):  # py-spy's native unwinding can fail
                spy = subprocess.run(
                    ["py-spy", "record", *native, "-r", "2000", "-d", str(max(1, round(seconds))),
                     "-p", str(client.pid), "-f", "raw", "-o", str(raw)],
                    capture_output=True, text=True, timeout=seconds + 120,
                )  # fmt: skip
                if spy.returncode == 0:
                    break
                print(f"py-spy record {' '.join(native)} failed: {spy.stderr.strip()[-300:]}")
            else:
                return
        finally:
            client.kill()
            client.wait()
        leaves: collections.Counter[str] = collections.Counter()
        through: collections.Counter[str] = collections.Counter()
        total = 0
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = stack.split(";")
            total += n
            leaves[frames[-1]] += n
            for frame in set(frames):
                through[frame] += n
    print(f"\npy-spy, {total} samples of the client over {seconds:g} s")
    print("  samples ending in:")
    for frame, n in leaves.most_common(top):
        print(f"  {100 * n / total:5.1f} %  {frame[:150]}")
    print("  samples passing through:")
    for frame, n in through.most_common(top):
        print(f"  {100 * n / total:5.1f} %  {frame[:150]}")


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.proxy.client_profile``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy.client_profile")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--op", choices=sorted(OPS), default="tiny")
    args = parser.parse_args(argv)
    client = CLIENT.format(step=OPS[args.op])
    with worker_process(args.backend) as (url, _):
        env = proxied_env(url, proxy_dir())
        calls = traced_calls(client, env, args.rounds)
        print(f"driver calls over {args.rounds} rounds of {OPS[args.op]}:")
        for name, n in calls.most_common():
            print(f"  {n / args.rounds:6.1f} a round  {name}")
        if args.seconds > 0:
            sampled(client, env, args.seconds, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
