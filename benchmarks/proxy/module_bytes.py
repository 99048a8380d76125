"""Module bytes per process start (issue 32, "modules sent once"): a command run twice or
more through the proxy (`hipr run`) against one worker, and what its code objects cost on
the wire each time, read from the worker's Prometheus metrics (docs/metrics.md:
``hipr_module_load_received_bytes``, ``hipr_module_store_hits``/``_misses``).

A start's module bytes are the code-object bytes MODULE_LOAD received plus, for each
load named by hash alone, that request's whole frame (header and CBOR map, computed with
the codec). The goal: the second start sends under 1 % of the first's.

    python -m benchmarks.proxy.module_bytes --backend cuda -- python3 -c "import torch; ..."
    python -m benchmarks.proxy.module_bytes --worker unix:///tmp/w.sock \\
        --metrics 127.0.0.1:9464 -- ./app
    python -m benchmarks.proxy.module_bytes      # CPU: an emulator worker that loads
                                                 # emulated fat binaries, and a Python
                                                 # client loading 16 of 2 MiB

Without ``--worker`` it starts a worker of ``--backend`` (``emulated``, the default: the
emulator of ``hipr.testing.module_images``; or ``cuda``/``hip``) on a unix socket with
its metrics on a free local port, and stops it at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from hipr.protocol.codec import encode_frame
from hipr.protocol.header import Flags
from hipr.protocol.messages import SHA256_BYTES, ModuleLoad
from hipr.protocol.opcodes import Opcode

#: The wire bytes of one MODULE_LOAD naming a code object by hash alone.
HASH_REQUEST_BYTES = len(
    encode_frame(Opcode.MODULE_LOAD, 1, Flags.NONE, {ModuleLoad.sha256: bytes(SHA256_BYTES)})
)
GOAL = 0.01


@dataclass(frozen=True)
class ModuleFigures:
    """A worker's module counters for one tenant (or all), as scraped."""

    received: float
    hits: float
    misses: float
    saved: float

    def __sub__(self, other: ModuleFigures) -> ModuleFigures:
        return ModuleFigures(
            self.received - other.received,
            self.hits - other.hits,
            self.misses - other.misses,
            self.saved - other.saved,
        )

    @property
    def wire_bytes(self) -> float:
        """Code-object bytes received, plus the frames that named one by hash alone."""
        return self.received + (self.hits + self.misses) * HASH_REQUEST_BYTES


def scrape(metrics: str, tenant: str | None = None) -> ModuleFigures:
    """The module counters of the worker whose metrics endpoint is ``HOST:PORT``, for
    ``tenant`` (None: summed over tenants)."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    wanted = {
        "hipr_module_load_received_bytes": "received",
        "hipr_module_store_hits": "hits",
        "hipr_module_store_misses": "misses",
        "hipr_module_store_saved_bytes": "saved",
    }
    found = dict.fromkeys(wanted.values(), 0.0)
    for family in text_string_to_metric_families(text):
        key = wanted.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and tenant in (None, sample.labels.get("tenant")):
                found[key] += sample.value
    return ModuleFigures(**found)


def free_port() -> int:
    """A local TCP port free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    sock: Path, metrics: str, process: subprocess.Popen[bytes], timeout: float = 60
) -> None:
    """Until the worker's unix socket and its metrics endpoint accept connections."""
    host, port = metrics.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the worker exited with {process.returncode}")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(sock))
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"no worker on {sock} with metrics on {metrics}")


def start_worker(backend: str, directory: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """A worker of ``backend`` on a unix socket in ``directory``: (process, url, metrics)."""
    sock = directory / "w.sock"
    metrics = f"127.0.0.1:{free_port()}"
    log = open(directory / "worker.log", "wb")  # noqa: SIM115 - the worker's lifetime
    if backend == "emulated":
        cmd = [sys.executable, "-m", "hipr.testing.module_images"]
        cmd += ["--listen", f"unix://{sock}", "--metrics", metrics]
    else:
        config = directory / "worker.toml"
        config.write_text(
            f'listen = ["unix://{sock}"]\nbackend = "{backend}"\nlog_level = "warning"\n'
            f'metrics_listen = "{metrics}"\n'
        )
        cmd = [sys.executable, "-m", "hipr", "worker", "--config", str(config)]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_for(sock, metrics, process)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process, f"unix://{sock}", metrics


#: The CPU run's command: the Python client loading 16 emulated fat binaries of 2 MiB.
EMULATED_LOAD = (
    "import os, hipr\n"
    "from hipr.testing.module_images import emulated_fatbin\n"
    "with hipr.connect(os.environ['HIPR_URL']) as gpu:\n"
    "    for seed in range(16):\n"
    "        gpu.module_load(emulated_fatbin(2 << 20, seed)).unload()\n"
)


def main(argv: list[str] | None = None) -> int:
    """Run the command ``--runs`` times and print each start's module bytes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help="a running worker's URL (else one is started)")
    parser.add_argument("--metrics", help="HOST:PORT of that worker's metrics endpoint")
    parser.add_argument("--tenant", help="count this tenant only (default: all)")
    parser.add_argument("--token-file", help="the tenant's token, for `hipr run`")
    parser.add_argument(
        "--backend", default="emulated", help="emulated (default), cuda or hip: the worker started"
    )
    parser.add_argument("--api", choices=("cuda", "hip"), help="the proxy `hipr run` puts in front")
    parser.add_argument("--runs", type=int, default=2, help="process starts (default 2)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    args = parser.parse_args(argv)
    command = [c for c in args.command if c != "--"] or [sys.executable, "-c", EMULATED_LOAD]
    if args.worker and not args.metrics:
        parser.error("--worker needs --metrics (the worker's metrics_listen)")
    with tempfile.TemporaryDirectory(prefix="hipr-mb-", dir="/tmp") as tmp:
        process = None
        if args.worker:
            url, metrics = args.worker, args.metrics
        else:
            process, url, metrics = start_worker(args.backend, Path(tmp))
        try:
            return _measure(args, command, url, metrics)
        finally:
            if process is not None:
                process.terminate()
                process.wait(30)


def _measure(args: argparse.Namespace, command: list[str], url: str, metrics: str) -> int:
    run = [sys.executable, "-m", "hipr", "run", "--url", url]
    if args.api:
        run += ["--api", args.api]
    if args.token_file:
        run += ["--token-file", args.token_file]
    starts: list[ModuleFigures] = []
    for i in range(args.runs):
        before = scrape(metrics, args.tenant)
        began = time.perf_counter()
        done = subprocess.run([*run, "--", *command], env=dict(os.environ), check=False)
        seconds = time.perf_counter() - began
        figures = scrape(metrics, args.tenant) - before
        starts.append(figures)
        print(
            f"start {i + 1}: exit {done.returncode}, {seconds:.2f} s, module bytes on the wire "
            f"{figures.wire_bytes:,.0f} (code objects {figures.received:,.0f}, loads by hash "
            f"{figures.hits:.0f} held + {figures.misses:.0f} not held, bytes saved "
            f"{figures.saved:,.0f})",
            flush=True,
        )
        if done.returncode != 0:
            return done.returncode
    first = starts[0].wire_bytes
    if first <= 0:
        print("the first start loaded no code objects through the worker: nothing to compare")
        return 1
    for i, later in enumerate(starts[1:], start=2):
        ratio = later.wire_bytes / first
        verdict = "meets" if ratio < GOAL else "misses"
        print(f"start {i} / start 1: {ratio:.4%} of the module bytes ({verdict} the < 1 % goal)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
