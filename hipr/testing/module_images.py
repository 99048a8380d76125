"""Code objects the emulator can load, for the tests and the CPU benchmark of the module
store (MODULE_LOAD by ``sha256``): the plain emulator refuses every image, as it runs only
its built-in kernels.

:func:`emulated_fatbin` builds a CUDA fat binary (its 16-byte header, which the proxies
read the size from, then a marker and filler) that :class:`ImageLoadingEmulator` loads as
a module of the built-in kernels. ``python -m hipr.testing.module_images --listen URL``
serves such an emulator (``--metrics HOST:PORT`` for its Prometheus endpoint) until
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import hashlib
import signal
import struct
from pathlib import Path

import anyio

from hipr.backends._emulator_objects import Module
from hipr.backends.emulator import EmulatorBackend
from hipr.kernels.builtins import BUILTINS
from hipr.observability.metrics import start_metrics_server
from hipr.protocol.header import PROTOCOL_MAJOR
from hipr.worker import client_link
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker

#: What the emulator recognises, right after the fat binary's header.
MARKER = b"HIPR-EMULATED-CODE-OBJECT\0"
#: A CUDA fat binary's magic and the header's size (cuda_modules.c reads both).
_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_HEADER = struct.Struct("<IHHQ")


def emulated_fatbin(size: int, seed: int = 0) -> bytes:
    """A ``size``-byte fat binary the :class:`ImageLoadingEmulator` loads; distinct seeds
    give distinct contents (and hashes)."""
    header = _FATBIN_HEADER.size
    if size < header + len(MARKER):
        raise ValueError(f"an emulated fat binary takes at least {header + len(MARKER)} bytes")
    body = bytearray(MARKER)
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest()
    while len(body) < size - header:
        body += block
        block = hashlib.sha256(block).digest()
    del body[size - header :]
    return _FATBIN_HEADER.pack(_FATBIN_MAGIC, 1, header, size - header) + bytes(body)


class ImageLoadingEmulator(EmulatorBackend):
    """The emulator, loading an :func:`emulated_fatbin` as a fresh module of the built-in
    kernels (any other image is refused as the emulator refuses it)."""

    def module_load(self, image: bytes) -> Module:
        """See :meth:`EmulatorBackend.module_load`."""
        head = bytes(image[: _FATBIN_HEADER.size + len(MARKER)])
        if head[_FATBIN_HEADER.size :] != MARKER:
            return super().module_load(image)
        module = Module(self._current(), dict(BUILTINS))
        with self._lock:
            self._modules.add(module)
        return module


async def serve(
    listen: str, metrics: str | None, tenants_file: Path | None, minor: int | None = None
) -> None:
    """Serve an :class:`ImageLoadingEmulator` on ``listen`` until SIGTERM or SIGINT;
    with ``minor``, answer HELLO as a worker of protocol 1.``minor`` (an older worker, to
    test the clients' fallback)."""
    if minor is not None:
        client_link.PROTOCOL_VERSION = (PROTOCOL_MAJOR << 8) | minor  # type: ignore[attr-defined]
    config = WorkerConfig(
        listen=(listen,), tenants_file=tenants_file, isolation="none", log_level="warning"
    )
    backend = ImageLoadingEmulator(device_count=1, total_memory=256 << 20)
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with running_worker(config, backend, [listen]) as worker:
            server = start_metrics_server(worker, metrics) if metrics else None
            try:
                async for _ in signals:
                    break
            finally:
                if server is not None:
                    server.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m hipr.testing.module_images --listen URL [--metrics HOST:PORT]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, help="the worker's URL (unix://PATH)")
    parser.add_argument("--metrics", help="HOST:PORT of its Prometheus endpoint")
    parser.add_argument("--tenants", type=Path, help="a tenants file")
    parser.add_argument(
        "--announce-minor", type=int, help="answer HELLO as a worker of protocol 1.N"
    )
    args = parser.parse_args(argv)
    anyio.run(serve, args.listen, args.metrics, args.tenants, args.announce_minor)


if __name__ == "__main__":
    main()
