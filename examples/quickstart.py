"""hipr quick start: a tour of the client API against a running worker.

    python examples/quickstart.py [URL]        # default tcp://127.0.0.1:18515

Start a worker first, e.g. ``hipr worker --backend emulator``; ``scripts/demo`` does both.
Every step prints what it did; any mismatch exits non-zero.
"""

from __future__ import annotations

import sys

import numpy as np

import hipr


def step(text: str) -> None:
    print(f"- {text}", flush=True)


def check(ok: object, what: str) -> None:
    if not ok:
        raise SystemExit(f"quickstart: FAILED: {what}")


def main(url: str) -> int:
    with hipr.connect(url) as gpu:
        step(f"connected to {url}")

        # Devices.
        count = gpu.device_count()
        step(f"{count} device(s)")
        for i in range(count):
            props = gpu.device_properties(i)
            step(
                f"device {i}: {props.name} ({props.arch}), "
                f"{props.total_memory / 2**30:.1f} GiB, {props.multiprocessor_count} CUs"
            )
        gpu.set_device(0)
        step(f"current device: {gpu.get_device()}")
        free, total = gpu.mem_get_info()
        step(f"memory: {free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB")

        # Memory: allocate, copy in, set, copy out.
        n = 1 << 20
        host = np.arange(n, dtype=np.float32)
        p = gpu.malloc(host.nbytes)
        step(f"malloc({host.nbytes}) -> 0x{int(p):x} ({p.size} bytes)")
        gpu.memcpy_htod(p, host)
        back = np.frombuffer(gpu.memcpy_dtoh(p, host.nbytes), dtype=np.float32)
        check(np.array_equal(back, host), "memcpy round trip differs")
        step(f"memcpy_htod + memcpy_dtoh of {host.nbytes} bytes: identical")

        gpu.memset(p + 256, 0, 1024)
        out = np.empty_like(host)
        gpu.memcpy_dtoh(p, host.nbytes, out=out)
        expected = host.copy()
        expected.view(np.uint8)[256 : 256 + 1024] = 0
        check(np.array_equal(out, expected), "memset result differs")
        step("memset of 1024 bytes at offset 256: checked")

        q = gpu.malloc(host.nbytes)
        gpu.memcpy_dtod(q, p, host.nbytes)
        check(gpu.memcpy_dtoh(q, host.nbytes) == expected.tobytes(), "memcpy_dtod differs")
        step("memcpy_dtod: checked")

        # A stream with an asynchronous copy, timed by events.
        s = gpu.stream_create()
        e0, e1 = gpu.event_create(), gpu.event_create()
        e0.record(s)
        gpu.memcpy_htod_async(q, host, stream=s)
        e1.record(s)
        e1.synchronize()
        ms = gpu.event_elapsed_ms(e0, e1)
        check(gpu.memcpy_dtoh(q, host.nbytes) == host.tobytes(), "async copy differs")
        step(f"memcpy_htod_async on a stream: {ms:.3f} ms between the events")
        for obj in (e0, e1, s):
            obj.destroy()

        # A built-in kernel: c = a + b.
        a, b, c = p, q, gpu.malloc(host.nbytes)
        gpu.memcpy_htod(a, host)
        gpu.memcpy_htod(b, 2 * host)
        k = gpu.builtin("vector_add_f32")
        k.launch(grid=(n // 256 + 1, 1, 1), block=(256, 1, 1), args=[c, a, b, np.uint64(n)])
        gpu.synchronize()
        result = np.frombuffer(gpu.memcpy_dtoh(c, host.nbytes), dtype=np.float32)
        check(np.array_equal(result, 3 * host), "vector_add_f32 result differs")
        step(f"vector_add_f32 over {n} floats: c == a + b")

        for ptr in (a, b, c):
            gpu.free(ptr)
        step("freed everything")
    step("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:18515"))
