"""Where the worker's time goes while PyTorch runs 1,000 ``add_`` then a synchronize
(or 1,000 ``t.item()``) through the CUDA proxy: each worker thread's CPU over the run,
and py-spy's samples of the worker, per thread (the functions seen most, and where the
samples ended).

    python -m benchmarks.proxy.each_profile [--backend cuda] [--seconds 5] [--top 40]
        [--op each|item]

A worker of ``--backend`` on a unix socket (``torch_compare.worker_process``); the
PyTorch client loops over rounds of 1,000 ``add_`` + synchronize (``--op item``: 1,000
``item()``) for ``--seconds``
while ``py-spy record --threads`` samples the worker, then once more without py-spy.
Needs py-spy on the path. A profile: it reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.proxy.torch_compare import proxied_env, proxy_dir, worker_process

#: The client's loop: ``--op each`` 1,000 ``add_`` then a synchronize a round, ``--op
#: item`` 1,000 ``t.item()`` (a 4-byte copy back and its wait each) a round.
OPS = {
    "each": ("for _ in range(1000): t.add_(1)\n    sync()", "add_"),
    "item": ("for _ in range(1000): t.item()", "item()"),
}

CLIENT = r"""
import sys, time, torch
t = torch.zeros(1, device="cuda")
sync = torch.cuda.synchronize
def one_round():
    {round}
for _ in range(3):
    one_round()
end = time.perf_counter() + float(sys.argv[1])
rounds, start = 0, time.perf_counter()
while time.perf_counter() < end:
    one_round(); rounds += 1
print(f"each of 1,000 {what}: {{(time.perf_counter() - start) / rounds / 1000 * 1e6:.2f}} us"
      f" over {{rounds}} rounds", flush=True)
"""


def cpu_by_thread(pid: int) -> dict[tuple[str, str], float]:
    """Seconds of CPU (user + system) of each thread of ``pid``, by (id, name)."""
    out: dict[tuple[str, str], float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[(tid, name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def summarise(raw: Path, top: int) -> None:
    """py-spy's raw samples, per thread: each function's share, then where samples ended."""
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    own: collections.Counter[tuple[str, str]] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, samples = stack.split(";"), int(count)
        thread = frames[0]
        total[thread] += samples
        for frame in set(frames[1:]):
            seen[(thread, frame)] += samples
        own[(thread, frames[-1])] += samples
    for thread, samples in total.most_common(4):
        print(f"=== {thread}: {samples} samples")
        for counter, what in ((seen, "in"), (own, "ending in")):
            rows = sorted(((n, f) for (t, f), n in counter.items() if t == thread), reverse=True)
            for n, frame in rows[:top]:
                print(f"{n:6d} {100 * n / samples:5.1f}% {what} {frame[:140]}")


def main(argv: list[str] | None = None) -> int:
    """Run the profile (module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--python", default=sys.executable, help="the Python with PyTorch")
    parser.add_argument("--op", choices=sorted(OPS), default="each")
    args = parser.parse_args(argv)
    body, what = OPS[args.op]
    client = CLIENT.format(round=body, what=what)
    with tempfile.TemporaryDirectory() as folder, worker_process(args.backend) as (url, pid):
        raw = Path(folder) / "spy.txt"
        env = proxied_env(url, proxy_dir())
        subprocess.run([args.python, "-c", client, "2"], env=env, check=True)  # warm-up
        before = cpu_by_thread(pid)
        spy = subprocess.Popen(
            ["py-spy", "record", "-p", str(pid), "-r", "2000", "-f", "raw", "--threads",
             "--nonblocking", "-d", str(int(args.seconds) + 1), "-o", str(raw)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.5)
        subprocess.run([args.python, "-c", client, str(args.seconds)], env=env, check=True)
        after = cpu_by_thread(pid)
        spy.wait()
        for key, spent in after.items():
            used = spent - before.get(key, 0.0)
            if used > 0.01:
                print(f"worker thread {key[1]} ({key[0]}): {used:.2f} s of CPU in the run")
        print("without py-spy:", flush=True)
        subprocess.run([args.python, "-c", client, str(args.seconds)], env=env, check=True)
        if raw.exists():
            summarise(raw, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
