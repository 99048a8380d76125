"""PyTorch and the CUDA driver API through the proxy's libcuda.so.1 beside the same work
locally and the machine's floors, in one run, with issue 32's goals.

``python -m benchmarks.proxy.torch_compare [--backend cuda] [--mib 256] [--trace]
[--before DIR]`` starts a worker on a unix socket (``--worker URL`` to use one), then
measures, in this order: the floors (``hipr.bench.floors``: blocking-socket echo and a
256 MiB stream each way, server in its own process), ``benchmarks/proxy/cuda_bench.c``
(built here) through the proxy (the worker's built-in kernel, and where nvcc is at hand a
cubin of tests/proxy/cuda/scale.cu) and against NVIDIA's driver with that cubin, and
``benchmarks/proxy/torch_ops.py`` through the proxy and locally. ``--trace`` also runs
torch_ops's steps under HIPR_PROXY_TRACE=1 and prints, per PyTorch op, the driver calls
and the round trips to the worker each made; ``--before DIR`` does the same with an
older build of the proxy (a folder holding its libcuda.so.1), for a before/after column.
A benchmark: goals missed are reported, never raised; a figure that fails says why.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from benchmarks.proxy.compare import floors

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MIB = 1 << 20
_CALL = re.compile(r"^hipr trace: (\w+) -> (-?\d+)[^(]*(?:\((\d+) round trips?\))?$")


def proxy_dir() -> Path:
    """The folder of the proxy's libcuda.so.1 (built by `hipr proxy build`)."""
    from hipr.proxy.build import CUDA_SUBDIR, LIB_DIR

    return LIB_DIR / CUDA_SUBDIR


@contextmanager
def worker(
    backend: str,
    extra_env: dict[str, str] | None = None,
    cpus: str | None = None,
    tree: Path | None = None,
) -> Iterator[str]:
    """A worker of `backend` on a unix socket, started without the proxy on its path
    (with ``extra_env`` added to its environment; pinned to ``cpus`` with taskset; the
    ``hipr`` package of ``tree``, another checkout, instead of this one): its URL."""
    with worker_process(backend, extra_env, cpus, tree) as (url, _):
        yield url


@contextmanager
def worker_process(
    backend: str,
    extra_env: dict[str, str] | None = None,
    cpus: str | None = None,
    tree: Path | None = None,
    args: Sequence[str] = (),
) -> Iterator[tuple[str, int]]:
    """:func:`worker`, yielding its URL and its process id; ``args`` go to ``hipr
    worker`` after the others (``--loop``, ``--config FILE``)."""
    directory = Path(tempfile.mkdtemp(prefix="htc-"))
    sock = directory / "w.sock"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env.update(extra_env or {})
    log = open(directory / "worker.log", "w")  # noqa: SIM115 - closed below
    pinned = ["taskset", "-c", cpus] if cpus else []
    process = subprocess.Popen(
        [*pinned, sys.executable, "-m", "hipr", "worker", "--backend", backend,
         "--listen", f"unix://{sock}", "--log-level", "warning", *args],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tree,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not sock.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not sock.exists():
            raise SystemExit(f"no worker: {(directory / 'worker.log').read_text()}")
        yield f"unix://{sock}", process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


def proxied_env(url: str, lib: Path, **extra: str) -> dict[str, str]:
    """The environment of a program run through the proxy in `lib` (first on the path)."""
    env = dict(os.environ, HIPR_URL=url, **extra)
    env["LD_LIBRARY_PATH"] = f"{lib}:{env.get('LD_LIBRARY_PATH', '')}".rstrip(":")
    return env


def local_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIPR_")}
    # The proxy's folder must not be first: NVIDIA's driver is what a local run maps.
    if "LD_LIBRARY_PATH" in env:
        env["LD_LIBRARY_PATH"] = ":".join(
            p for p in env["LD_LIBRARY_PATH"].split(":") if "hipr/proxy/lib" not in p
        )
    return env


def build_bench(directory: Path, lib: Path) -> tuple[Path | None, Path | None]:
    """cuda_bench (linked by soname, so the library path picks the driver) and, where nvcc
    is at hand, a cubin of scale.cu for the local run."""
    bench = directory / "cuda_bench"
    cc = shutil.which("cc") or shutil.which("gcc")
    out = subprocess.run(
        [cc or "cc", "-O2", "-std=c11", str(HERE / "cuda_bench.c"), "-o", str(bench),
         f"-L{lib}", "-l:libcuda.so.1"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        print("cuda_bench: build FAILED:", out.stderr[-500:])
        return None, None
    cubin = None
    nvcc = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
    )
    if nvcc:
        cubin = directory / "scale.cubin"
        arch = os.environ.get("HIPR_BENCH_ARCH", "sm_90")
        made = subprocess.run(
            [nvcc, "-cubin", f"-arch={arch}", str(ROOT / "tests/proxy/cuda/scale.cu"),
             "-o", str(cubin)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if made.returncode != 0:
            print("scale.cubin: nvcc FAILED:", made.stderr[-300:])
            cubin = None
    return bench, cubin


def run_bench(bench: Path, env: dict[str, str], mib: int, module: str | None) -> dict[str, object]:
    args = [str(bench), str(mib)] + ([module] if module else [])
    try:
        out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    figures: dict[str, object] = {}
    for line in out.stdout.splitlines():
        name, _, value = line.partition(" ")
        try:
            figures[name] = float(value)
        except ValueError:
            pass
    if out.returncode != 0:
        figures["error"] = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
    return figures


def run_torch(
    python: str,
    env: dict[str, str],
    mib: int,
    only: str | None = None,
    launcher: list[str] | None = None,
) -> dict[str, object]:
    """torch_ops.py's figures (``launcher``: the command that runs it instead of
    ``python``, e.g. taskset and its CPUs before the interpreter)."""
    cmd = [*(launcher or [python]), str(HERE / "torch_ops.py"), "--mib", str(mib)]
    if only:
        cmd += ["--only", only]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    result: dict[str, object] = {}
    for line in out.stdout.splitlines():
        try:
            part = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(part, dict):
            result.update(part)
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-2:]
        result["error"] = f"exit {out.returncode}: {' | '.join(tail)}"[:400]
    return result


def traced_steps(
    python: str, env: dict[str, str], n: int, log: Path | None = None
) -> list[tuple[str, int, Counter[str], Counter[str]]]:
    """torch_ops --steps under the trace: per step, its op count, the calls made and the
    round trips each call name made."""
    cmd = [python, str(HERE / "torch_ops.py"), "--steps", str(n)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if log is not None:
        log.write_text(out.stderr)
    result: list[tuple[str, int, Counter[str], Counter[str]]] = []
    for line in out.stderr.splitlines():
        if line.startswith("== "):
            name, _, reps = line[3:].rpartition(" x")
            result.append((name, int(reps), Counter(), Counter()))
        elif result and (m := _CALL.match(line)):
            result[-1][2][m[1]] += 1
            result[-1][3][m[1]] += int(m[3] or 0)
        elif result and "FAILED" in line:
            result[-1][2][line.strip()[:120]] += 1
    if out.returncode != 0:
        print(f"traced run exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")
    return [r for r in result if r[0] != "end"]


def print_steps(label: str, steps: list[tuple[str, int, Counter[str], Counter[str]]]) -> None:
    print(f"\n-- driver calls per PyTorch op ({label}): calls/op, round trips/op in []")
    for name, per, calls, trips in steps:
        total = sum(trips.values()) / per
        parts = []
        for call, count in sorted(calls.items(), key=lambda kv: -kv[1]):
            t = trips.get(call, 0)
            parts.append(f"{call} {count / per:g}" + (f" [{t / per:g}]" if t else ""))
        print(f"{name:45} round trips/op {total:g}: {', '.join(parts) or '(none)'}")


def num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) else None


def fmt(v: object, digits: int = 2) -> str:
    f = num(v)
    if f is not None:
        return f"{f:.{digits}f}"
    return "-" if v is None else str(v)[:60]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy.torch_compare")
    parser.add_argument("--worker", help="a running worker's URL (else one is started)")
    parser.add_argument("--backend", default="cuda", help="the started worker's backend")
    parser.add_argument("--mib", type=int, default=256, help="copy size (MiB)")
    parser.add_argument("--python", default=sys.executable, help="the Python with PyTorch")
    parser.add_argument("--trace", action="store_true", help="per-op driver calls, traced")
    parser.add_argument("--steps", type=int, default=20, help="repeats per traced step")
    parser.add_argument("--before", type=Path, help="an older proxy build's libcuda folder")
    parser.add_argument("--trace-log", type=Path, help="a folder for the traced runs' stderr")
    parser.add_argument("--no-torch", action="store_true", help="the C benchmark only")
    parser.add_argument(
        "--extra", action="append", default=[], metavar="LABEL:VAR=VALUE[,VAR=VALUE]",
        help="one more proxied PyTorch run with this environment added (e.g. "
        "spin:HIPR_SPIN_US=5000), measuring the figures --extra-only names",
    )  # fmt: skip
    parser.add_argument("--extra-only", default="matmul,tiny", help="figures of --extra runs")
    args = parser.parse_args(argv)
    lib = proxy_dir()
    size = args.mib * MIB
    with tempfile.TemporaryDirectory(prefix="htc-") as tmp:
        bench, cubin = build_bench(Path(tmp), lib)
        if args.worker:
            report(args, lib, size, bench, cubin, args.worker)
        else:
            with worker(args.backend) as url:
                report(args, lib, size, bench, cubin, url)
    return 0


def report(args: argparse.Namespace, lib: Path, size: int, bench: Path | None,
           cubin: Path | None, url: str) -> None:  # fmt: skip
    floor = floors(size)
    echo_us, push, pull = floor.echo_median * 1e6, floor.gbs("push"), floor.gbs("pull")
    rings = {"push": floor.gbs("push_ring"), "pull": floor.gbs("pull_ring")}
    ring_push, ring_pull = rings["push"], rings["pull"]
    print(f"floors (blocking sockets, unix): echo {echo_us:.1f} us, {args.mib} MiB stream "
          f"push {push:.2f} GB/s, pull {pull:.2f} GB/s; the server's end along a 64 MiB "
          f"ring (the ring floor): push {ring_push:.2f}, pull {ring_pull:.2f} GB/s")  # fmt: skip
    libs = [("proxy", lib)] + ([("before", args.before)] if args.before else [])
    cb: dict[str, dict[str, object]] = {}
    if bench:
        for label, where in libs:
            cb[f"{label} builtin"] = run_bench(bench, proxied_env(url, where), args.mib, None)
            if cubin and label == "proxy":
                cb[f"{label} cubin"] = run_bench(
                    bench, proxied_env(url, where), args.mib, str(cubin)
                )
        if cubin:
            cb["local cubin"] = run_bench(bench, local_env(), args.mib, str(cubin))
    if cb:
        names = list(cb)
        keys: list[str] = []
        for figures in cb.values():
            keys += [k for k in figures if k not in keys]
        print("\n-- cuda_bench (driver API), medians; us or GB/s")
        print(f"{'figure':28}" + "".join(f"{n:>16}" for n in names))
        for k in keys:
            if k != "error":
                print(f"{k:28}" + "".join(f"{fmt(cb[n].get(k)):>16}" for n in names))
        for n in names:
            if "error" in cb[n]:
                print(f"{n}: FAILED {cb[n]['error']}"[:300])
    if args.no_torch:
        return
    torch_runs: dict[str, dict[str, object]] = {}
    for label, where in libs:
        torch_runs[label] = run_torch(args.python, proxied_env(url, where), args.mib)
    torch_runs["local"] = run_torch(args.python, local_env(), args.mib)
    p, loc = torch_runs["proxy"], torch_runs["local"]
    mapped = f"proxy libcuda: {p.get('libcuda')}, local: {loc.get('libcuda')}"
    print(f"\n-- PyTorch (torch_ops.py), {mapped}")
    for label, run in torch_runs.items():
        if "error" in run or any(str(v).startswith("FAILED") for v in run.values()):
            bad = {k: v for k, v in run.items() if k == "error" or str(v).startswith("FAILED")}
            print(f"{label}: {bad}")
    before = torch_runs.get("before", {})
    head = f"{'figure':34} {'proxy':>9} {'local':>9}" + (f" {'before':>9}" if before else "")
    print(head + f" {'ratio':>8}  goal")

    def row(label: str, key: str, goal: str, met: object) -> None:
        pv, lv = num(p.get(key)), num(loc.get(key))
        ratio = ""
        if pv is not None and lv:
            ratio = f"{pv / lv:.2f}x"
        verdict = "" if met is None else (": met" if met else ": NOT met")
        extra = f" {fmt(before.get(key)):>9}" if before else ""
        print(f"{label:34} {fmt(p.get(key)):>9} {fmt(loc.get(key)):>9}{extra} {ratio:>8}  "
              f"{goal}{verdict}")  # fmt: skip

    def ok(key: str, test: object) -> object:
        v = num(p.get(key))
        return None if v is None else test

    tiny, many = num(p.get("tiny_op_sync_us")), num(p.get("op_of_1000_us"))
    row("tiny add_ + synchronize, us", "tiny_op_sync_us", f"<= 50 us (echo floor {echo_us:.1f} us)",
        ok("tiny_op_sync_us", tiny is not None and tiny <= 50))  # fmt: skip
    lm = num(loc.get("op_of_1000_us"))
    row("each of 1,000 add_ then sync, us", "op_of_1000_us", "<= 1.5x local",
        ok("op_of_1000_us", many is not None and lm is not None and many <= 1.5 * lm))  # fmt: skip
    row("item(), us", "item_us", "(one D2H + stream sync)", None)
    for key, floor_gbs, name in [
        ("h2d_pageable_GBps", push, "push"), ("d2h_pageable_GBps", pull, "pull"),
        ("h2d_pinned_GBps", push, "push"), ("d2h_pinned_GBps", pull, "pull"),
    ]:  # fmt: skip
        v = num(p.get(key))
        share = f", {100 * v / floor_gbs:.0f} % of it" if v is not None else ""
        if v is not None and rings[name]:
            share += f" ({100 * v / rings[name]:.0f} % of the ring floor)"
        row(f"{args.mib} MiB {key[:3]} {key.split('_')[1]}, GB/s", key,
            f">= 85 % of {name} floor {floor_gbs:.2f} GB/s{share}",
            ok(key, v is not None and v >= 0.85 * floor_gbs))  # fmt: skip
    mm, lmm = num(p.get("matmul_4096_ms")), num(loc.get("matmul_4096_ms"))
    row("matmul 4096^2, ms", "matmul_4096_ms", "<= 1.1x local",
        ok("matmul_4096_ms", mm is not None and lmm is not None and mm <= 1.1 * lmm))  # fmt: skip
    spread = ", ".join(
        f"{label} {run.get('matmul_4096_p10_p90_ms')}" for label, run in torch_runs.items()
    )
    print(f"matmul 4096^2 p10-p90 ms (same repeats): {spread}")
    for extra in args.extra:
        label, _, assignments = extra.partition(":")
        env_extra = dict(a.split("=", 1) for a in assignments.split(",") if "=" in a)
        run = run_torch(args.python, proxied_env(url, lib, **env_extra), args.mib, args.extra_only)
        got = {k: v for k, v in run.items() if k not in ("device", "libcuda")}
        ratio = ""
        if (v := num(run.get("matmul_4096_ms"))) is not None and lmm:
            ratio = f" (matmul {v / lmm:.2f}x local)"
        print(f"variant {label} ({assignments}): {json.dumps(got)}{ratio}")
    if args.trace:
        for label, where in libs:
            env = proxied_env(url, where, HIPR_PROXY_TRACE="1")
            log = args.trace_log / f"trace-{label}.log" if args.trace_log else None
            print_steps(label, traced_steps(args.python, env, args.steps, log))


if __name__ == "__main__":
    raise SystemExit(main())
