"""What tenant isolation costs and what it buys: ``python -m hipr.testing.isolation_report``.

For each isolation mode (``none``, ``process``, ``session``) a worker with two tenants,
alice and bob, serves on a Unix socket in this process (its children, if any, are
processes of their own), and the report measures:

- start-up: the time to a first session of a tenant (a child worker starting, under
  process isolation) and to a later one, and resident memory (the children's, read from
  /proc; with ``none``, this process's growth);
- the pointer attack: alice writes a secret; bob's kernel reads alice's pointer value,
  passed as a plain 64-bit integer. Whether bob got alice's bytes;
- the fault: bob's kernel reads address 0x10. What bob's session got; whether alice's
  open session and a new one of alice work; and the recovery time, from the fault's
  error to the first working round trip of bob's next session.

The kernels are ``copy_from_address_u8`` (a builtin, runs on the emulator too) or, with
``--compiled``, the same read compiled at run time through ``gpu.compile()``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import hipr
from hipr.client.connection import LinkOptions
from hipr.testing.harness import worker_with_children
from hipr.worker.config import WorkerConfig
from hipr.worker.isolation import process_rss
from hipr.worker.server import Worker, load_configured_backend
from hipr.worker.tenants import new_token, token_hash

MODES = ("none", "process", "session")
SECRET = b"alice's secret: 0123456789abcdef".ljust(256, b"#")
#: A raw read, as a user's kernel would write it (the builtin's source, compiled anew).
READ_SOURCE = r"""
#include <hip/hip_runtime.h>
extern "C" __global__ void read_address(unsigned char* out, unsigned long long address,
                                        unsigned long long n) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)blockDim.x * gridDim.x)
    out[i] = ((const unsigned char*)address)[i];
}
"""
LINK = LinkOptions(reconnect_attempts=0, reconnect_timeout=1.0)


@dataclass
class ModeReport:
    """The figures of one isolation mode."""

    mode: str
    first_session_s: float = 0.0
    later_session_s: float = 0.0
    #: Per child worker (process, session) or this process's growth (none), bytes.
    rss_bytes: dict[str, int] = field(default_factory=dict)
    pointer_attack: str = ""
    fault_seen_by_bob: str = ""
    alice_open_session_after_fault: str = ""
    alice_new_session_after_fault: str = ""
    bob_next_session_after_fault: str = ""
    recovery_s: float | None = None
    context_resets: dict[str, int] = field(default_factory=dict)


def _outcome(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


async def _read(gpu: Any, address: int, n: int, compiled: bool) -> bytes:
    out = await gpu.malloc(n)
    if compiled:
        module = await gpu.compile(READ_SOURCE, "read_address.hip")
        kernel = await module.function("read_address")
    else:
        kernel = await gpu.builtin("copy_from_address_u8")
    await kernel.launch((1,), (256,), [out, np.uint64(address), np.uint64(n)])
    await gpu.synchronize()
    return bytes(await gpu.memcpy_dtoh(out, n))


async def _round_trip(gpu: Any, data: bytes = b"ok") -> bool:
    return bool(await gpu.memcpy_dtoh(await gpu.malloc_htod(data), len(data)) == data)


async def _probe(url: str, token: str) -> str:
    try:
        async with hipr.aconnect(url, token=token, link=LINK) as gpu:
            return "works" if await _round_trip(gpu) else "wrong bytes"
    except hipr.HipError as exc:
        return "fails: " + _outcome(exc)


async def measure_mode(
    mode: str, config: WorkerConfig, directory: Path, compiled: bool, service: bool = False
) -> ModeReport:
    """Start a worker of ``mode`` and run the measurements against it."""
    alice_token, bob_token = new_token(), new_token()
    tenants = directory / f"tenants-{mode}.toml"
    tenants.write_text(
        f'[tenants.alice]\ntokens = ["{token_hash(alice_token)}"]\n'
        f'[tenants.bob]\ntokens = ["{token_hash(bob_token)}"]\n'
    )
    config = WorkerConfig(
        **{
            **{k: getattr(config, k) for k in ("backend", "log_level", "emulator")},
            "tenants_file": tenants,
            "isolation": mode,
            "pinned_payload_bytes": 0,
        }
    )
    report = ModeReport(mode)
    url = f"unix://{directory}/{mode}.sock"
    if service:
        await _measure_service(config, directory, url, alice_token, bob_token, report, compiled)
        return report
    rss_before = process_rss(os.getpid())
    backend = load_configured_backend(config)
    async with worker_with_children(config, backend, url) as worker:
        await _measure(worker, url, alice_token, bob_token, report, compiled, rss_before)
    if mode == "none":
        backend.close()
    return report


async def _measure(
    worker: Worker | None,
    url: str,
    alice_token: str,
    bob_token: str,
    report: ModeReport,
    compiled: bool,
    rss_before: int,
    service_pids: list[int] | None = None,
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        started = time.perf_counter()
        alice = await stack.enter_async_context(hipr.aconnect(url, token=alice_token, link=LINK))
        await _round_trip(alice)
        report.first_session_s = time.perf_counter() - started
        started = time.perf_counter()
        async with hipr.aconnect(url, token=alice_token, link=LINK) as second:
            await _round_trip(second)
        report.later_session_s = time.perf_counter() - started
        # The secret sits past a few other allocations: not where a fresh process's
        # first allocation lands, which would be bob's own memory in his process.
        for _ in range(4):
            await alice.malloc(1 << 20)
        secret = int(await alice.malloc_htod(SECRET))

        async with hipr.aconnect(url, token=bob_token, link=LINK) as bob:
            try:
                got = await _read(bob, secret, len(SECRET), compiled)
                report.pointer_attack = (
                    "BOB READ ALICE'S BYTES" if got == SECRET else "bob got other bytes"
                )
            except hipr.HipError as exc:
                report.pointer_attack = "refused: " + _outcome(exc)
        if worker is None:
            pid = (service_pids or [0])[-1]
            report.rss_bytes = {f"worker[{pid}]": process_rss(pid)}
        elif worker.isolation is not None:
            statuses = await worker.isolation.poll()
            report.rss_bytes = {f"{s.tenant}[{s.pid}]": s.rss for s in statuses}
        else:
            report.rss_bytes = {"worker growth": process_rss(os.getpid()) - rss_before}

        bob = await stack.enter_async_context(hipr.aconnect(url, token=bob_token, link=LINK))
        await _round_trip(bob)
        try:
            await _read(bob, 0x10, 16, compiled)
            report.fault_seen_by_bob = "no error"
        except hipr.HipError as exc:
            report.fault_seen_by_bob = _outcome(exc)
        faulted = time.perf_counter()
        try:
            ok = await alice.memcpy_dtoh(secret, len(SECRET)) == SECRET
            report.alice_open_session_after_fault = "works" if ok else "wrong bytes"
        except hipr.HipError as exc:
            report.alice_open_session_after_fault = "fails: " + _outcome(exc)
        with anyio.fail_after(60):
            while True:
                outcome = await _probe(url, bob_token)
                if outcome == "works" or time.perf_counter() - faulted > 30:
                    break
                await anyio.sleep(0.05)
        report.recovery_s = time.perf_counter() - faulted if outcome == "works" else None
        report.bob_next_session_after_fault = outcome
        report.alice_new_session_after_fault = await _probe(url, alice_token)
        if worker is not None:
            report.context_resets = worker.context_resets()


async def _measure_service(
    config: WorkerConfig,
    directory: Path,
    url: str,
    alice_token: str,
    bob_token: str,
    report: ModeReport,
    compiled: bool,
) -> None:
    """The worker as a service runs it: ``hipr worker`` in a process of its own, started
    again whenever it exits with a failure (systemd's Restart=on-failure, without its
    RestartSec=2 delay, which adds to the recovery time measured here)."""
    path = directory / f"{report.mode}.worker.toml"
    path.write_text(
        f'listen = ["{url}"]\nbackend = "{config.backend}"\nisolation = "{config.isolation}"\n'
        f'tenants_file = "{config.tenants_file}"\nlog_level = "warning"\n'
        "pinned_payload_bytes = 0\n"
    )
    exits: list[int] = []
    stop = anyio.Event()
    pids: list[int] = []

    async def supervise() -> None:
        while not stop.is_set():
            process = await anyio.open_process(
                [sys.executable, "-m", "hipr", "worker", "--config", str(path)],
                stdin=None,
                stdout=None,
                stderr=None,
            )
            pids.append(process.pid)
            try:
                with anyio.CancelScope(shield=True):
                    while process.returncode is None and not stop.is_set():
                        with anyio.move_on_after(0.05):
                            await process.wait()
                    if process.returncode is None:
                        process.terminate()
                        await process.wait()
            finally:
                exits.append(int(process.returncode or 0))
            if exits[-1] == 0:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(supervise)
        with anyio.fail_after(120):
            while await _probe(url, alice_token) != "works":
                await anyio.sleep(0.05)
        await _measure(None, url, alice_token, bob_token, report, compiled, 0, pids)
        stop.set()
    report.context_resets = {"worker exits": len(exits) - 1, "exit statuses": exits}  # type: ignore[dict-item]


def per_session_costs(reports: list[ModeReport]) -> dict[str, Any]:
    """The summary the docs quote."""
    by = {r.mode: r for r in reports}
    out: dict[str, Any] = {}
    for mode, r in by.items():
        out[mode] = {
            "first_session_s": round(r.first_session_s, 3),
            "later_session_s": round(r.later_session_s, 3),
            "rss_mib": {k: round(v / 2**20, 1) for k, v in r.rss_bytes.items()},
            "recovery_s": None if r.recovery_s is None else round(r.recovery_s, 3),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """Run every mode and print the report (text, then JSON)."""
    parser = argparse.ArgumentParser(prog="python -m hipr.testing.isolation_report")
    parser.add_argument("--backend", default="emulator", choices=("emulator", "cuda", "hip"))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--compiled", action="store_true", help="read through a kernel compiled at run time"
    )
    parser.add_argument("--json", type=Path, help="also write the JSON report here")
    parser.add_argument(
        "--service",
        action="store_true",
        help="run isolation = none as `hipr worker` in its own process, restarted on failure",
    )
    args = parser.parse_args(argv)
    config = WorkerConfig(backend=args.backend, log_level="error")
    reports: list[ModeReport] = []
    with tempfile.TemporaryDirectory(prefix="hipr-iso-", dir="/tmp") as tmp:
        for mode in args.modes.split(","):
            service = args.service and mode == "none"
            report = anyio.run(measure_mode, mode, config, Path(tmp), args.compiled, service)
            reports.append(report)
            print(f"== isolation = {mode!r}")
            for key, value in asdict(report).items():
                if key != "mode":
                    print(f"  {key}: {value}")
            sys.stdout.flush()
    document = {
        "backend": args.backend,
        "kernel": "compiled read_address" if args.compiled else "builtin copy_from_address_u8",
        "host": platform.node(),
        "python": platform.python_version(),
        "hipr": hipr.__version__,
        "summary": per_session_costs(reports),
        "modes": [asdict(r) for r in reports],
    }
    print(json.dumps(document["summary"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
