"""Where an unmodified program's tiny op + synchronize spends its time through the CUDA
proxy, stage by stage, on the instrumented worker of ``benchmarks.stages``.

    python -m benchmarks.proxy.stages [--backend cuda] [--count N] [--profile N]
        [--client torch,cupy,hip]

Each client is a program run through ``hipr run`` (the proxy ``libcuda.so.1``, or
``libamdhip64.so`` for ``hip``) that times ``count`` rounds of one tiny kernel and a
device synchronize, each round one fused request (protocol 1.3's LAUNCH_KERNEL with
``synchronize``):

- ``torch``: ``x.add_(1)`` on a one-element tensor, then ``torch.cuda.synchronize()``;
- ``torch_item``: ``x.item()``, a 4-byte copy back, stage by stage as its own
  (``ITEM_STAGES``: the quick copy on the loop in place of the launch);
- ``cupy``: a one-thread ``RawKernel``, then ``cupy.cuda.Device().synchronize()``;
- ``hip``: the same one-thread kernel through hip-python (``hipModuleLaunchKernel``,
  ``hipDeviceSynchronize``), where hip-python is installed;
- ``python``: hipr's own sync client (``hipr.connect()``, the built-in ``fill_f32`` of
  one element, then ``synchronize()``: two requests a round), not through a proxy; it
  runs against the emulator too.

The client writes each round's start and end (``time.perf_counter_ns``: CLOCK_MONOTONIC,
comparable with the worker's marks) and the rounds are matched with the worker's marks
by time: each stage's median and 90th percentile is printed, so a client whose rounds
cost more can be told apart by where (the worker's wake-up, its decoding, the handler's
checks, the runtime's launch, the kernel, the reply's bookkeeping, or the client's own
work after the reply). ``--profile N`` then runs the first client again with the
worker's event-loop thread under cProfile and prints its top ``N`` functions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.stages import _first_between, _print, _print_profile, _spans, _Worker

ROUND_STAGES = (
    "client call -> step returns",
    "step returns -> worker data_received",
    "data_received -> request starts",
    "request starts -> runtime launch call",
    "runtime launch call",
    "launch returned -> kernel seen done",
    "kernel seen done -> reply send starts",
    "reply send",
    "reply sent -> client round ends",
    "total",
)

#: The same stages with the proxy's own marks (``HIPR_PROXY_MARKS``) splitting the second.
PROXY_ROUND_STAGES = (
    ROUND_STAGES[0],
    "step returns -> proxy's synchronize",
    "proxy's synchronize -> request sent",
    "request sent -> worker data_received",
    *ROUND_STAGES[2:],
)

#: A copy back's stages (the ``torch_item`` client: ``x.item()``, one MEMCPY_DTOH a round,
#: answered in the I/O callback by the quick copy on the loop).
ITEM_STAGES = (
    "client call -> worker data_received",
    "data_received -> request starts",
    "request starts -> quick copy called",
    "quick copy (queued, polled, copied out)",
    "copy returned -> reply send starts",
    "reply send",
    "reply sent -> client round ends",
    "total",
)

_TIMING = """
import json, os, sys, time
def timed(step, sync, count):
    for _ in range(300):
        step(); sync()
    rounds, clock = [], time.perf_counter_ns
    for _ in range(count):
        t0 = clock(); step(); t1 = clock(); sync(); rounds.append((t0, t1, clock()))
    with open(os.environ["HIPR_STAGES_OUT"], "w") as f:
        json.dump(rounds, f)
"""

_CLIENTS = {
    "torch": _TIMING
    + """
import torch
x = torch.ones(1, device="cuda")
timed(lambda: x.add_(1), torch.cuda.synchronize, int(sys.argv[1]))
""",
    # A copy back, not a launch: its own stages (ITEM_STAGES).
    "torch_item": _TIMING
    + """
import torch
x = torch.ones(1, device="cuda")
timed(x.item, lambda: None, int(sys.argv[1]))
""",
    "cupy": _TIMING
    + """
import cupy as cp
k = cp.RawKernel(r'extern "C" __global__ void one(float* p) { p[0] += 1.0f; }', "one")
p = cp.zeros(1, dtype=cp.float32)
d = cp.cuda.Device()
timed(lambda: k((1,), (1,), (p,)), d.synchronize, int(sys.argv[1]))
""",
    "hip": _TIMING
    + """
from hip import hip, hiprtc
def ok(result):
    err, rest = result[0], result[1:]
    if int(err):
        raise RuntimeError(str(err))
    return rest[0] if len(rest) == 1 else rest
src = b'extern "C" __global__ void one(float* p) { p[0] += 1.0f; }'
prog = ok(hiprtc.hiprtcCreateProgram(src, b"one", 0, [], []))
arch = ok(hip.hipGetDeviceProperties(0)).gcnArchName
arch = arch if isinstance(arch, bytes) else arch.encode()
ok(hiprtc.hiprtcCompileProgram(prog, 1, [b"--offload-arch=" + arch]))
code = bytearray(ok(hiprtc.hiprtcGetCodeSize(prog)))
ok(hiprtc.hiprtcGetCode(prog, code))
fn = ok(hip.hipModuleGetFunction(ok(hip.hipModuleLoadData(code)), b"one"))
p = ok(hip.hipMalloc(4))
def step():
    ok(hip.hipModuleLaunchKernel(fn, 1, 1, 1, 1, 1, 1, sharedMemBytes=0, stream=None,
                                 kernelParams=None, extra=(p,)))
timed(step, lambda: ok(hip.hipDeviceSynchronize()), int(sys.argv[1]))
""",
    "python": _TIMING
    + """
import numpy as np
import hipr
gpu = hipr.connect(os.environ["HIPR_URL"])
word = gpu.malloc(4)
fill = gpu.builtin("fill_f32")
args = [word, np.float32(1.0), np.uint64(1)]
timed(lambda: fill.launch(1, 1, args), gpu.synchronize, int(sys.argv[1]))
gpu.close()
""",
}


def _round_stages(
    client: Sequence[tuple[int, int, int]],
    marks: dict[str, list[int]],
    proxy: Sequence[tuple[int, int]] = (),
) -> dict[str, list[int]]:
    """Per-stage durations (ns) of each client round (its start, the return of its step,
    its end) whose marks are all found inside its own window (one fused request a round):
    rounds missing a point are left out. The step's return splits the client's part: the
    program's own call (for PyTorch, ``add_``'s dispatch and the proxy's note of the
    launch) from the synchronize's call, the proxy's send and the worker's wake-up; the
    proxy's marks (``proxy``: when each fused synchronize reached the proxy's core and
    when its request was sent), where given, split that again."""
    reached = [r for r, _ in proxy]
    sent_at = dict(proxy)
    starts = sorted(marks.get("starts", [])[::2])
    calls = marks.get("launch_calls", [])
    call_starts, call_ends = calls[::2], calls[1::2]
    seen = sorted(marks.get("polled", []) + marks.get("waited", []))
    recvs = sorted(marks.get("recv", []))
    send0, send1 = marks.get("send0", []), marks.get("send1", [])
    kept: list[tuple[int, int]] = []
    names = PROXY_ROUND_STAGES if proxy else ROUND_STAGES
    points: list[list[int]] = [[] for _ in range(len(names) - 2)]
    for begun, stepped, finished in client:
        arrived = _first_between(recvs, stepped, finished)
        if arrived is None:
            continue
        own: tuple[int, ...] = ()
        if proxy:
            entered = _first_between(reached, stepped, arrived)
            if entered is None or sent_at[entered] > arrived:
                continue
            own = (entered, sent_at[entered])
        started = _first_between(starts, arrived, finished)
        call = _first_between(call_starts, arrived, finished)
        if started is None or call is None:
            continue
        called_end = call_ends[call_starts.index(call)]
        done = _first_between(seen, called_end, finished)
        sent = _first_between(send0, done, finished) if done is not None else None
        if done is None or sent is None:
            continue
        sent_end = send1[send0.index(sent)]
        kept.append((begun, finished))
        for series, value in zip(
            points,
            (stepped, *own, arrived, started, call, called_end, done, sent, sent_end),
            strict=True,
        ):
            series.append(value)
    return _spans(names, kept, points) if kept else {}


def _item_stages(
    client: Sequence[tuple[int, int, int]], marks: dict[str, list[int]]
) -> dict[str, list[int]]:
    """Per-stage durations (ns) of each ``torch_item`` round (:data:`ITEM_STAGES`) whose
    marks are all found inside its own window; rounds missing a point are left out."""
    recvs = sorted(marks.get("recv", []))
    starts = sorted(marks.get("starts", [])[::2])
    copies = marks.get("copy_calls", [])
    copy_starts, copy_ends = copies[::2], copies[1::2]
    send0, send1 = marks.get("send0", []), marks.get("send1", [])
    kept: list[tuple[int, int]] = []
    points: list[list[int]] = [[] for _ in range(len(ITEM_STAGES) - 2)]
    for begun, _, finished in client:
        arrived = _first_between(recvs, begun, finished)
        started = _first_between(starts, arrived, finished) if arrived is not None else None
        copy = _first_between(copy_starts, started, finished) if started is not None else None
        if arrived is None or started is None or copy is None:
            continue
        copied = copy_ends[copy_starts.index(copy)]
        sent = _first_between(send0, copied, finished)
        if sent is None:
            continue
        kept.append((begun, finished))
        for series, value in zip(
            points, (arrived, started, copy, copied, sent, send1[send0.index(sent)]), strict=True
        ):
            series.append(value)
    return _spans(ITEM_STAGES, kept, points) if kept else {}


def _run_client(
    name: str, url: str, count: int, out_path: Path
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """The client's rounds, and the proxy's marks of its synchronizes (none for the
    Python client, or from a proxy without them)."""
    proxy_marks = out_path.with_suffix(".marks")
    proxy_marks.unlink(missing_ok=True)
    env = dict(os.environ, HIPR_STAGES_OUT=str(out_path), HIPR_URL=url)
    env["HIPR_PROXY_MARKS"] = str(proxy_marks)
    command = [sys.executable, "-c", _CLIENTS[name], str(count)]
    if name != "python":  # the others through the proxy runtime
        api = "hip" if name == "hip" else "cuda"
        command = [sys.executable, "-m", "hipr", "run", "--url", url, "--api", api, "--", *command]
    subprocess.run(command, env=env, check=True, timeout=300)
    rounds = [(a, b, c) for a, b, c in json.loads(out_path.read_text())]
    proxy: list[tuple[int, int]] = []
    if proxy_marks.exists():
        for line in proxy_marks.read_text().splitlines():
            reached, sent = line.split()
            proxy.append((int(reached), int(sent)))
    return rounds, proxy


def measure(backend: str, count: int, clients: Sequence[str], profile_top: int) -> None:
    """Each client's rounds against one instrumented worker, stage by stage."""
    worker = _Worker(backend, "uvloop")
    directory = Path(tempfile.mkdtemp(prefix="hipr-proxy-stages-"))
    url = f"unix://{worker.socket}"
    try:
        for name in clients:
            try:
                client, proxy = _run_client(name, url, count, directory / f"{name}.json")
            except (subprocess.SubprocessError, OSError) as error:
                print(f"{name}: did not run ({error})")
                continue
            if name == "torch_item":
                stages = _item_stages(client, worker.marks())
            else:
                stages = _round_stages(client, worker.marks(), proxy)
            print(f"\n{backend} worker, {name} through the proxy: {len(client)} rounds")
            if not stages:
                print("  no round matched the worker's marks")
                continue
            print(f"  rounds matched: {len(stages['total'])} of {len(client)}")
            what = "item()" if name == "torch_item" else "tiny op + synchronize"
            _print(f"  stages of one {what} ({name})", stages, print)
        if profile_top and clients:
            first = clients[0]

            def profiled() -> None:
                _run_client(first, url, count, directory / "profiled.json")

            stats = worker.profile(profiled)
            title = f"\nworker loop thread, {first} rounds, by own time"
            _print_profile(title, stats, profile_top, print)
    finally:
        worker.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.proxy.stages``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy.stages", description=__doc__)
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--client", default="torch,cupy", help="torch, cupy, hip, python")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    options = parser.parse_args(argv)
    clients = [c for c in options.client.split(",") if c]
    unknown = set(clients) - set(_CLIENTS)
    if unknown:
        parser.error(f"unknown client(s): {', '.join(sorted(unknown))}")
    measure(options.backend, options.count, clients, options.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
