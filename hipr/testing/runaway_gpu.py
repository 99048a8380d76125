"""Runaway kernels on a real worker (issue 36): ``python -m hipr.testing.runaway_gpu``.

Starts ``hipr worker`` processes with two tenants (and a third with a
``max_kernel_seconds`` quota) and plays the issue's scenario for each isolation mode:

1. alice measures compile + launch + synchronize (median of many rounds);
2. bob launches a kernel that never ends (``while (flag[0] == 0) {}``) and closes his
   connection; alice measures again while bob's kernel runs, then after ``runaway_grace``;
3. (process isolation) carol's kernel runs past her ``max_kernel_seconds``: her
   synchronize gets the error naming the quota, and her next session works;
4. bob launches his kernel again and the worker gets SIGTERM: how long it takes to exit,
   with what status, and what its log says it cut short.

On the emulator (``--backend emulator``, for a dry run without a GPU) alice uses the
built-in ``fill_f32`` and bob the emulator's ``spin_until_flag``; on a GPU both compile
their kernels with ``gpu.compile()``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import hipr
from hipr.errors import HipError, RunawayKernelError
from hipr.kernels.spin_kernel import SPIN_KERNEL_NAME, SPIN_SOURCE
from hipr.worker.tenants import new_token, token_hash

ALICE_SOURCE = r"""
#include <hip/hip_runtime.h>
extern "C" __global__ void touch(float* x) { x[threadIdx.x] += 1.0f; }
"""
TOKENS = {name: new_token() for name in ("alice", "bob", "carol")}


def say(*parts: object) -> None:
    """One line of the run's record."""
    print(*parts, flush=True)


@dataclass
class RunningWorker:
    """A ``hipr worker`` process of this run."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    metrics: str

    def log_lines(self, *needles: str) -> list[str]:
        """Log lines holding every one of ``needles``."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [line for line in text.splitlines() if all(n in line for n in needles)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_worker(
    where: Path, backend: str, isolation: str, grace: float, shutdown_timeout: float
) -> RunningWorker:
    """A worker on a Unix socket, with alice, bob and carol (max_kernel_seconds = 2)."""
    where.mkdir(parents=True, exist_ok=True)
    tenants = where / "tenants.toml"
    tenants.write_text(
        "".join(
            f'[tenants.{name}]\ntokens = ["{token_hash(token)}"]\n'
            + ("max_kernel_seconds = 2.0\n" if name == "carol" else "")
            for name, token in TOKENS.items()
        )
    )
    sock = where / "w.sock"
    port = _free_port()
    config = where / "worker.toml"
    config.write_text(
        f'listen = ["unix://{sock}"]\nbackend = "{backend}"\nisolation = "{isolation}"\n'
        f'tenants_file = "{tenants}"\nrunaway_grace = {grace}\n'
        f"shutdown_timeout = {shutdown_timeout}\nresume_grace = 0\n"
        f'metrics_listen = "127.0.0.1:{port}"\nlog_format = "json"\n'
    )
    log = where / "worker.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "hipr", "worker", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while not sock.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the worker did not start:\n{log.read_text()}")
        time.sleep(0.05)
    return RunningWorker(process, f"unix://{sock}", log, f"http://127.0.0.1:{port}/metrics")


class Alice:
    """Alice's unit of work: compile (the worker's cache answers after the first),
    launch, synchronize."""

    def __init__(self, gpu: Any, emulated: bool) -> None:
        self.gpu = gpu
        self.emulated = emulated
        self.buf = gpu.malloc(32 * 4)
        gpu.memset(self.buf, 0, 32 * 4)

    def round(self) -> float:
        started = time.perf_counter()
        if self.emulated:
            fill = self.gpu.builtin("fill_f32")
            fill.launch((1, 1, 1), (32, 1, 1), [self.buf, np.float32(1.0), np.uint64(32)])
        else:
            module = self.gpu.compile(ALICE_SOURCE, "alice.hip")
            module.function("touch").launch((1, 1, 1), (32, 1, 1), [self.buf])
        self.gpu.synchronize()
        took = time.perf_counter() - started
        if not self.emulated:
            module.unload()
        return took

    def median(self, rounds: int, limit: float = 30.0) -> tuple[float | None, int]:
        """Median seconds of ``rounds`` rounds, run in a thread bounded by ``limit`` s:
        (None, done) when they did not all finish (alice blocked)."""
        times: list[float] = []

        def run() -> None:
            for _ in range(rounds):
                times.append(self.round())

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(limit)
        if thread.is_alive():
            return None, len(times)
        return statistics.median(times), len(times)


def launch_endless(gpu: Any, emulated: bool) -> None:
    """Launch ``while (flag[0] == 0) {}`` on ``gpu``; returns once the worker has it."""
    flag = gpu.malloc(4)
    gpu.memset(flag, 0, 4)
    if emulated:
        spin = gpu.builtin(SPIN_KERNEL_NAME)
    else:
        spin = gpu.compile(SPIN_SOURCE, "spin.hip").function(SPIN_KERNEL_NAME)
    spin.launch((1, 1, 1), (1, 1, 1), [flag])
    gpu.ping()


def leave_in_background(gpu: Any) -> threading.Thread:
    """Close ``gpu`` (GOODBYE) from a thread, as bob walks away: returns at once."""
    thread = threading.Thread(target=gpu.close, daemon=True)
    thread.start()
    return thread


def ms(value: float | None) -> str:
    return "blocked" if value is None else f"{value * 1e3:.3f} ms"


def runaway_metrics(worker: RunningWorker) -> list[str]:
    try:
        with urllib.request.urlopen(worker.metrics, timeout=5) as reply:
            text = reply.read().decode()
    except OSError as exc:
        return [f"(metrics unavailable: {exc})"]
    return [line for line in text.splitlines() if line.startswith("hipr_runaway")]


def sigterm(worker: RunningWorker, shutdown_timeout: float, emulated: bool, relaunch: bool) -> None:
    """SIGTERM with bob's endless kernel running: how long until the worker is gone.
    ``relaunch``: bob launches a new one first (under process isolation his first was
    stopped); in a shared process his first still runs, and a new call could block on
    the context it holds."""
    bob = None
    if relaunch:
        bob = hipr.connect(worker.url, token=TOKENS["bob"])
        launch_endless(bob, emulated)
    sent = time.monotonic()
    worker.process.send_signal(signal.SIGTERM)
    try:
        code: int | None = worker.process.wait(shutdown_timeout + 30)
    except subprocess.TimeoutExpired:
        code = None
        worker.process.kill()
        worker.process.wait()
    took = time.monotonic() - sent
    say(
        f"  SIGTERM with an endless kernel running: exited after {took:.2f} s "
        f"(shutdown_timeout {shutdown_timeout:g} s, hard deadline {shutdown_timeout + 5:g} s), "
        f"exit status {code if code is not None else 'none: still running, killed'}"
    )
    for line in worker.log_lines("cut short"):
        say("  log:", _short(line))
    if bob is not None:
        threading.Thread(target=bob.close, daemon=True).start()


def _short(line: str) -> str:
    try:
        row = json.loads(line)
    except ValueError:
        return line[:400]
    keep = (
        "event",
        "tenant",
        "reason",
        "seconds",
        "because",
        "exit_status",
        "sessions",
        "tenant_processes_cut_short",
    )
    return json.dumps({k: row[k] for k in keep if k in row})[:600]


def scenario(backend: str, isolation: str, where: Path, args: argparse.Namespace) -> None:
    emulated = backend == "emulator"
    say(f"\n== isolation = {isolation!r}, runaway_grace = {args.grace:g} s ==")
    worker = start_worker(where, backend, isolation, args.grace, args.shutdown_timeout)
    try:
        alice_gpu = hipr.connect(worker.url, token=TOKENS["alice"])
        alice = Alice(alice_gpu, emulated)
        alice.median(20)  # warm: the compile cache, the context
        baseline, _ = alice.median(args.rounds)
        say(f"  alice baseline (compile+launch+sync, median of {args.rounds}): {ms(baseline)}")
        bob = hipr.connect(worker.url, token=TOKENS["bob"])
        launch_endless(bob, emulated)
        left = time.monotonic()
        leaving = leave_in_background(bob)
        say("  bob launched while (flag[0] == 0) {} and closed his connection")
        during, done = alice.median(args.rounds // 2, limit=max(1.0, args.grace * 0.6))
        say(
            f"  alice during bob's runaway (before the grace): {ms(during)}"
            + ("" if during is not None else f" ({done} rounds done in the time)")
        )
        wait = left + args.grace + 2.0 - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        after, done = alice.median(args.rounds, limit=30.0)
        ratio = "" if after is None or baseline is None else f" ({after / baseline:.2f}x baseline)"
        say(f"  alice after the grace: {ms(after)}{ratio}")
        leaving.join(10)
        for line in worker.log_lines("runaway GPU work"):
            say("  log:", _short(line))
        for line in runaway_metrics(worker):
            say("  metric:", line)
        if isolation == "process":
            carol_quota(worker, emulated)
        if after is None:
            say("  (alice is blocked: her client is left behind)")
        else:
            alice_gpu.close()
        sigterm(worker, args.shutdown_timeout, emulated, relaunch=isolation == "process")
    finally:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait()


def carol_quota(worker: RunningWorker, emulated: bool) -> None:
    """Carol's kernel runs past max_kernel_seconds = 2: the error, then a new session."""
    carol = hipr.connect(worker.url, token=TOKENS["carol"])
    launch_endless(carol, emulated)
    started = time.monotonic()
    try:
        carol.synchronize()
        say("  carol: synchronize returned (unexpected)")
    except RunawayKernelError as exc:
        say(f"  carol past max_kernel_seconds: after {time.monotonic() - started:.2f} s: {exc}")
        say(f"    details: {exc.details}")
    except HipError as exc:
        say(f"  carol: unexpected error {type(exc).__name__}: {exc}")
    threading.Thread(target=carol.close, daemon=True).start()
    again = hipr.connect(worker.url, token=TOKENS["carol"])
    ok = again.memcpy_dtoh(again.malloc_htod(b"works"), 5) == b"works"
    say(f"  carol's next session works: {ok}")
    again.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--isolation", action="append", choices=("process", "none"))
    parser.add_argument("--grace", type=float, default=3.0)
    parser.add_argument("--shutdown-timeout", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args(argv)
    where = Path(tempfile.mkdtemp(prefix="hipr-runaway-"))
    try:
        for isolation in args.isolation or ["process", "none"]:
            scenario(args.backend, isolation, where / isolation, args)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
