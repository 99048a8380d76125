"""The emulator backend against HIP's rules and the built-in kernels' numpy meaning."""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from hipr.backends import _emulator_core as emu_core
from hipr.backends import emulator as emu
from hipr.backends.emulator import EmulatorBackend
from hipr.backends.interface import Backend, BackendStats
from hipr.errors import HipError, HipErrorCode
from hipr.kernels.builtins import BUILTINS
from hipr.kernels.kernel_args import arg_layout, unpack_args

E = HipErrorCode
MiB = 1024 * 1024


@pytest.fixture
def gpu() -> Iterator[EmulatorBackend]:
    backend = EmulatorBackend(total_memory=16 * MiB)
    yield backend
    backend.close()


@contextlib.contextmanager
def raises(code: HipErrorCode) -> Iterator[pytest.ExceptionInfo[HipError]]:
    """pytest.raises for a HipError of exactly ``code``."""
    with pytest.raises(HipError) as info:
        yield info
    assert info.value.code == code, f"expected {code.name}, got {info.value!r}"


def upload(gpu: EmulatorBackend, array: np.ndarray) -> int:
    ptr = gpu.malloc(array.nbytes)
    gpu.memcpy_htod(ptr, np.ascontiguousarray(array).data)
    return ptr


def download(gpu: EmulatorBackend, ptr: int, dtype: type[np.generic], n: int) -> np.ndarray:
    out = np.empty(n, dtype=dtype)
    gpu.memcpy_dtoh(out.data, ptr)
    return out


def pack(fmt: str, *values: object) -> bytes:
    """Little-endian struct packing; callers spell out C padding with ``x``."""
    return struct.pack("<" + fmt, *values)


def fn(gpu: EmulatorBackend, name: str) -> object:
    return gpu.module_get_function(gpu.builtin_module(), name)


# --- interface and devices --------------------------------------------------------------


def test_satisfies_backend_protocol() -> None:
    backend = EmulatorBackend()
    assert isinstance(backend, Backend)
    assert backend.name == "emulator"
    assert backend.device_count() == 1
    assert backend.stats() == BackendStats()


def test_device_properties() -> None:
    gpu = EmulatorBackend(device_count=2, total_memory=32 * MiB, name="emu-x", arch="emu9")
    props = gpu.device_properties(1)
    assert props.name == "emu-x" and props.arch == "emu9"
    assert props.total_memory == 32 * MiB
    assert props.multiprocessor_count == 8
    assert props.warp_size in (32, 64)
    assert props.max_threads_per_block == 1024
    assert props.clock_rate_khz > 0 and props.max_shared_memory_per_block > 0
    assert gpu.device_properties(0).pci_bus_id == "0000:00:00.0"
    assert props.pci_bus_id == "0000:01:00.0"
    assert props.to_wire()["name"] == "emu-x"
    for bad in (2, -1):
        with raises(E.hipErrorInvalidDevice):
            gpu.device_properties(bad)
        with raises(E.hipErrorInvalidDevice):
            gpu.bind_thread(bad)


def test_constructor_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        EmulatorBackend(device_count=0)
    with pytest.raises(ValueError):
        EmulatorBackend(total_memory=0)


# --- memory ---------------------------------------------------------------------------------


def test_malloc_addresses_are_page_aligned_distinct_and_accounted(gpu: EmulatorBackend) -> None:
    assert gpu.mem_get_info() == (16 * MiB, 16 * MiB)
    ptrs = [gpu.malloc(size) for size in (1, 100, 4096, 5000)]
    assert all(p != 0 and p % emu.PAGE_SIZE == 0 for p in ptrs)
    assert len(set(ptrs)) == 4
    assert all(emu.ARENA_BASE <= p < emu.ARENA_BASE + emu.ARENA_SPAN for p in ptrs)
    assert gpu.mem_get_info() == (16 * MiB - 9197, 16 * MiB)
    assert gpu.stats() == BackendStats(allocations=4, allocated_bytes=9197)
    for p in ptrs:
        gpu.free(p)
    assert gpu.stats().is_zero()
    # A freed address is not handed out again soon: a stale pointer must not alias.
    assert gpu.malloc(1) not in ptrs


def test_out_of_memory_exactly_at_the_limit() -> None:
    gpu = EmulatorBackend(total_memory=MiB)
    whole = gpu.malloc(MiB)
    assert gpu.mem_get_info() == (0, MiB)
    with raises(E.hipErrorOutOfMemory):
        gpu.malloc(1)
    gpu.free(whole)
    with raises(E.hipErrorOutOfMemory):
        gpu.malloc(MiB + 1)
    a = gpu.malloc(MiB - 10)
    with raises(E.hipErrorOutOfMemory):
        gpu.malloc(11)
    b = gpu.malloc(10)
    assert gpu.mem_get_info() == (0, MiB)
    gpu.free(a)
    gpu.free(b)
    assert gpu.stats().is_zero()


def test_malloc_bad_sizes(gpu: EmulatorBackend) -> None:
    for size in (0, -1):
        with raises(E.hipErrorInvalidValue):
            gpu.malloc(size)
    assert gpu.stats().is_zero()


def test_free_of_unknown_interior_and_double(gpu: EmulatorBackend) -> None:
    ptr = gpu.malloc(64)
    for bad in (ptr + 8, 12345, emu.ARENA_BASE + emu.ARENA_SPAN - emu.PAGE_SIZE):
        with raises(E.hipErrorInvalidValue):
            gpu.free(bad)
    gpu.free(ptr)
    with raises(E.hipErrorInvalidValue):
        gpu.free(ptr)
    gpu.free(0)  # hipFree(nullptr) is a no-op


def test_address_space_wraps_to_free_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emu_core, "ARENA_SPAN", 8 * emu.PAGE_SIZE)
    gpu = EmulatorBackend(device_count=2, total_memory=8 * emu.PAGE_SIZE)
    keep = gpu.malloc(10)
    seen: set[int] = set()
    for _ in range(50):
        a = gpu.malloc(emu.PAGE_SIZE)
        b = gpu.malloc(2 * emu.PAGE_SIZE + 1)
        assert len({keep, a, b}) == 3
        assert min(a, b) >= emu.ARENA_BASE and max(a, b) < emu.ARENA_BASE + 8 * emu.PAGE_SIZE
        assert not a <= keep < a + emu.PAGE_SIZE and not b <= keep < b + 3 * emu.PAGE_SIZE
        seen.update((a, b))
        gpu.free(a)
        gpu.free(b)
    assert len(seen) > 2
    gpu.bind_thread(1)
    assert gpu.malloc(1) == emu.ARENA_BASE + 8 * emu.PAGE_SIZE


def test_copies_round_trip_and_interior_pointers(gpu: EmulatorBackend) -> None:
    data = np.arange(256, dtype=np.uint8)
    ptr = upload(gpu, data)
    assert np.array_equal(download(gpu, ptr, np.uint8, 256), data)
    gpu.memcpy_htod(ptr + 100, memoryview(b"\xaa\xbb\xcc"))
    part = bytearray(5)
    gpu.memcpy_dtoh(memoryview(part), ptr + 99)
    assert bytes(part) == bytes([99, 0xAA, 0xBB, 0xCC, 103])
    # A multi-dimensional, typed host buffer travels as its bytes.
    floats = np.arange(6, dtype=np.float32).reshape(2, 3)
    gpu.memcpy_htod(ptr + 8, floats.data)
    assert np.array_equal(download(gpu, ptr + 8, np.float32, 6), floats.ravel())
    # Interior pointers also work for device copies and memset.
    other = gpu.malloc(16)
    gpu.memcpy_dtod(other + 4, ptr + 100, 3)
    gpu.memset(other, 7, 4)
    assert bytes(download(gpu, other, np.uint8, 8)) == b"\x07" * 4 + b"\xaa\xbb\xcc\x00"


def test_dtod_overlap_is_memmove(gpu: EmulatorBackend) -> None:
    ptr = upload(gpu, np.arange(10, dtype=np.uint8))
    gpu.memcpy_dtod(ptr + 2, ptr, 6)
    assert list(download(gpu, ptr, np.uint8, 10)) == [0, 1, 0, 1, 2, 3, 4, 5, 8, 9]
    gpu.memcpy_htod(ptr, np.arange(10, dtype=np.uint8).data)
    gpu.memcpy_dtod(ptr, ptr + 2, 6)
    assert list(download(gpu, ptr, np.uint8, 10)) == [2, 3, 4, 5, 6, 7, 6, 7, 8, 9]


def test_memset_takes_the_low_byte(gpu: EmulatorBackend) -> None:
    ptr = gpu.malloc(8)
    gpu.memset(ptr, 0x1AB, 4)
    gpu.memset(ptr + 4, -1, 4)
    assert bytes(download(gpu, ptr, np.uint8, 8)) == b"\xab" * 4 + b"\xff" * 4


def test_overrunning_operations_write_nothing(gpu: EmulatorBackend) -> None:
    a = upload(gpu, np.zeros(4096, dtype=np.uint8))
    b = upload(gpu, np.zeros(4096, dtype=np.uint8))
    assert b == a + 4096  # adjacent: an overrun of a would land in b
    with raises(E.hipErrorInvalidValue):
        gpu.memcpy_htod(a + 4090, memoryview(b"\x01" * 10))
    with raises(E.hipErrorInvalidValue):
        gpu.memset(a + 1, 1, 4096)
    with raises(E.hipErrorInvalidValue):
        gpu.memcpy_dtod(a + 4000, b, 100)
    with raises(E.hipErrorInvalidValue):
        gpu.memcpy_dtod(b, a + 4000, 100)
    with raises(E.hipErrorInvalidValue):
        gpu.memcpy_htod(a - 1, memoryview(b"\x01"))
    with raises(E.hipErrorInvalidValue):
        gpu.memset(12345, 1, 1)
    host = bytearray(b"\x55" * 10)
    with raises(E.hipErrorInvalidValue):
        gpu.memcpy_dtoh(memoryview(host), a + 4090)
    assert host == b"\x55" * 10
    assert not download(gpu, a, np.uint8, 4096).any()
    assert not download(gpu, b, np.uint8, 4096).any()
    with raises(E.hipErrorInvalidValue):
        gpu.memcpy_dtoh(memoryview(b"immutable"), a)
    with raises(E.hipErrorInvalidValue):
        gpu.memset(a, 0, -1)
    with raises(E.hipErrorInvalidValue):
        gpu.memcpy_dtod(a, b, -1)


def test_freed_memory_is_refused(gpu: EmulatorBackend) -> None:
    ptr = gpu.malloc(16)
    gpu.free(ptr)
    with raises(E.hipErrorInvalidValue):
        gpu.memset(ptr, 0, 1)


def test_zero_byte_operations(gpu: EmulatorBackend) -> None:
    ptr = gpu.malloc(16)
    gpu.memcpy_htod(ptr + 15, memoryview(b""))
    gpu.memcpy_dtoh(memoryview(bytearray()), ptr)
    gpu.memcpy_dtod(ptr, ptr + 8, 0)
    gpu.memset(ptr + 3, 1, 0)
    with raises(E.hipErrorInvalidValue):
        gpu.memset(ptr + 16, 1, 0)  # one past the end is not inside the allocation
    with raises(E.hipErrorInvalidValue):
        gpu.memcpy_dtod(12345, ptr, 0)


def test_current_device_is_per_thread() -> None:
    gpu = EmulatorBackend(device_count=2, total_memory=MiB)
    results: dict[str, object] = {}

    def worker() -> None:
        gpu.bind_thread(1)
        results["ptr"] = gpu.malloc(1000)
        results["info"] = gpu.mem_get_info()
        results["stream"] = gpu.stream_create()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    ptr = results["ptr"]
    assert isinstance(ptr, int)
    assert emu.ARENA_BASE + emu.ARENA_SPAN <= ptr < emu.ARENA_BASE + 2 * emu.ARENA_SPAN
    assert results["info"] == (MiB - 1000, MiB)
    # This thread never bound: it is on device 0, which is untouched.
    assert gpu.mem_get_info() == (MiB, MiB)
    local = gpu.malloc(10)
    assert emu.ARENA_BASE <= local < emu.ARENA_BASE + emu.ARENA_SPAN
    # A device pointer names its device: copies between devices work from any thread.
    gpu.memset(ptr, 9, 10)
    gpu.memcpy_dtod(local, ptr, 10)
    assert bytes(download(gpu, local, np.uint8, 10)) == b"\x09" * 10
    # Work on a stream runs on the stream's device.
    event = gpu.event_create()  # device 0
    with raises(E.hipErrorInvalidHandle):
        gpu.event_record(event, results["stream"])
    gpu.bind_thread(1)
    assert gpu.mem_get_info() == (MiB - 1000, MiB)


def test_concurrent_malloc_free_returns_to_zero() -> None:
    gpu = EmulatorBackend(device_count=2, total_memory=64 * MiB)
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(index: int) -> None:
        try:
            gpu.bind_thread(index % 2)
            barrier.wait()
            rng = np.random.default_rng(index)
            live: list[int] = []
            for step in range(300):
                ptr = gpu.malloc(int(rng.integers(1, 10_000)))
                gpu.memset(ptr, index, 1)
                live.append(ptr)
                if step % 3 == 0:
                    stream = gpu.stream_create()
                    gpu.memcpy_dtod(live[0], ptr, 1, stream)
                    gpu.stream_destroy(stream)
                if len(live) > 5:
                    gpu.free(live.pop(int(rng.integers(0, len(live)))))
            for ptr in live:
                gpu.free(ptr)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert gpu.stats().is_zero()
    assert gpu.mem_get_info() == (64 * MiB, 64 * MiB)


# --- streams and events ---------------------------------------------------------------


def test_streams(gpu: EmulatorBackend) -> None:
    stream = gpu.stream_create()
    assert gpu.stats().streams == 1
    ptr = gpu.malloc(8)
    gpu.memset(ptr, 3, 8, stream)
    gpu.memcpy_htod(ptr, memoryview(b"ab"), stream)
    out = bytearray(8)
    gpu.memcpy_dtoh(memoryview(out), ptr, stream)
    assert out == b"ab" + b"\x03" * 6
    assert gpu.stream_query(stream) and gpu.stream_query(None)
    gpu.stream_synchronize(stream)
    gpu.stream_synchronize(None)
    event = gpu.event_create()
    gpu.event_record(event, None)
    gpu.stream_wait_event(stream, event)
    gpu.stream_wait_event(None, event)
    gpu.stream_destroy(stream)
    assert gpu.stats().streams == 0
    for call in (
        lambda: gpu.stream_destroy(stream),
        lambda: gpu.stream_synchronize(stream),
        lambda: gpu.stream_query(stream),
        lambda: gpu.memset(ptr, 0, 1, stream),
        lambda: gpu.stream_wait_event(stream, event),
    ):
        with raises(E.hipErrorInvalidHandle):
            call()


def test_events_and_elapsed_time(gpu: EmulatorBackend) -> None:
    start, end = gpu.event_create(), gpu.event_create()
    assert gpu.event_query(start)  # never recorded: complete, as in HIP
    with raises(E.hipErrorInvalidHandle):
        gpu.event_elapsed_ms(start, end)
    stream = gpu.stream_create()
    gpu.event_record(start, stream)
    with raises(E.hipErrorInvalidHandle):
        gpu.event_elapsed_ms(start, end)
    time.sleep(0.02)
    gpu.event_record(end, stream)
    gpu.event_synchronize(end)
    assert gpu.event_query(end)
    elapsed = gpu.event_elapsed_ms(start, end)
    assert 15.0 <= elapsed < 5000.0
    assert gpu.event_elapsed_ms(start, start) == 0.0
    assert gpu.stats().events == 2
    gpu.event_destroy(start)
    gpu.event_destroy(end)
    assert gpu.stats().events == 0
    for call in (
        lambda: gpu.event_elapsed_ms(start, end),
        lambda: gpu.event_record(start, None),
        lambda: gpu.event_query(start),
        lambda: gpu.event_synchronize(start),
        lambda: gpu.event_destroy(start),
    ):
        with raises(E.hipErrorInvalidHandle):
            call()


def test_handle_kinds_cannot_be_confused(gpu: EmulatorBackend) -> None:
    stream, event = gpu.stream_create(), gpu.event_create()
    module = gpu.builtin_module()
    function = gpu.module_get_function(module, "fill_f32")
    graph = gpu.graph_create()
    node = gpu.graph_add_memset(graph, [], gpu.malloc(4), 0, 4)
    graph_exec = gpu.graph_instantiate(graph)
    foreign = EmulatorBackend().stream_create()
    checks: list[Callable[[], object]] = [
        lambda: gpu.stream_synchronize(event),
        lambda: gpu.stream_destroy(graph),
        lambda: gpu.stream_synchronize(foreign),
        lambda: gpu.stream_synchronize(12345),
        lambda: gpu.event_record(stream, None),
        lambda: gpu.event_synchronize(stream),
        lambda: gpu.module_get_function(function, "fill_f32"),
        lambda: gpu.module_unload(graph),
        lambda: gpu.launch(module, (1, 1, 1), (1, 1, 1), 0, None, b""),
        lambda: gpu.graph_launch(graph, None),
        lambda: gpu.graph_instantiate(graph_exec),
        lambda: gpu.graph_add_memset(node, [], 0, 0, 0),
        lambda: gpu.graph_exec_destroy(stream),
        lambda: gpu.graph_destroy(event),
    ]
    for check in checks:
        with raises(E.hipErrorInvalidHandle):
            check()


# --- modules and kernels ------------------------------------------------------------------


def test_compile_and_module_load_are_refused(gpu: EmulatorBackend) -> None:
    with raises(E.hipErrorNotSupported) as info:
        gpu.compile('extern "C" __global__ void k() {}', "k.hip", [])
    assert "no device compiler" in info.value.message
    assert "builtin" in info.value.message
    with raises(E.hipErrorInvalidImage):
        gpu.module_load(b"\x7fELF not really")
    assert gpu.stats().modules == 0


def test_builtin_module_functions(gpu: EmulatorBackend) -> None:
    module = gpu.builtin_module()
    assert gpu.builtin_module() is module  # shared, and owned by the backend:
    assert gpu.stats().modules == 0  # not counted as any session's resource
    for name in BUILTINS:
        assert gpu.module_get_function(module, name) is gpu.module_get_function(module, name)
    with raises(E.hipErrorNotFound):
        gpu.module_get_function(module, "no_such_kernel")
    function = gpu.module_get_function(module, "fill_f32")
    gpu.module_unload(module)
    assert gpu.stats().modules == 0
    with raises(E.hipErrorInvalidHandle):
        gpu.module_get_function(module, "fill_f32")
    ptr = gpu.malloc(4)
    with raises(E.hipErrorInvalidHandle):
        gpu.launch(function, (1, 1, 1), (1, 1, 1), 0, None, pack("Qf4xQ", ptr, 1.0, 1))


def test_arg_layout_follows_c_rules() -> None:
    assert arg_layout(BUILTINS["fill_f32"].arg_kinds).offsets == (0, 8, 16)
    assert arg_layout(BUILTINS["fill_f32"].arg_kinds).size == 24
    probe = arg_layout(BUILTINS["mixed_args_probe"].arg_kinds)
    # ptr, i8, i32, f32, f64, i16, struct{i8; f64; i16} (align 8, 24 bytes), u64
    assert probe.offsets == (0, 8, 12, 16, 24, 32, 40, 64)
    assert probe.size == 72
    assert arg_layout(("i8", "i16", "i8")).size == 5  # no trailing padding
    assert arg_layout(("f16", "u8")).offsets == (0, 2) and arg_layout(("f16", "u8")).size == 3
    assert unpack_args(arg_layout(("u8", "u32")), pack("B3xI", 200, 7)) == (200, 7)
    with raises(E.hipErrorInvalidValue):
        arg_layout(("i128",))


def test_fill_scale_axpy_vector_add(gpu: EmulatorBackend) -> None:
    n = 1000
    rng = np.random.default_rng(1)
    x_host = rng.standard_normal(n).astype(np.float32)
    y_host = rng.standard_normal(n).astype(np.float32)
    x, y = upload(gpu, x_host), upload(gpu, y_host)
    c = gpu.malloc(4 * n)
    launch = gpu.launch

    launch(fn(gpu, "fill_f32"), (2, 1, 1), (64, 1, 1), 0, None, pack("Qf4xQ", c, 2.5, n))
    assert np.array_equal(download(gpu, c, np.float32, n), np.full(n, 2.5, np.float32))

    launch(fn(gpu, "scale_f32"), (1, 1, 1), (1, 1, 1), 0, None, pack("Qf4xQ", x, 0.5, n))
    assert np.array_equal(download(gpu, x, np.float32, n), x_host * np.float32(0.5))
    x_host = x_host * np.float32(0.5)

    launch(fn(gpu, "axpy_f32"), (4, 1, 1), (256, 1, 1), 0, None, pack("QQf4xQ", y, x, 3.0, n))
    expected_y = y_host + np.float32(3.0) * x_host
    assert np.allclose(download(gpu, y, np.float32, n), expected_y, rtol=1e-6, atol=1e-6)

    launch(fn(gpu, "vector_add_f32"), (8, 1, 1), (128, 1, 1), 0, None, pack("QQQQ", c, x, y, n))
    assert np.array_equal(download(gpu, c, np.float32, n), x_host + expected_y)

    # Interior pointers and partial n: only the named elements change.
    launch(fn(gpu, "fill_f32"), (1, 1, 1), (32, 1, 1), 0, None, pack("Qf4xQ", c + 40, -1.0, 3))
    got = download(gpu, c, np.float32, n)
    assert list(got[10:13]) == [-1.0] * 3
    assert np.array_equal(got[:10], (x_host + expected_y)[:10])
    assert np.array_equal(got[13:], (x_host + expected_y)[13:])


@pytest.mark.parametrize(
    ("n", "grid", "block"),
    [(1, 1, 1), (1000, 1, 256), (100_000, 7, 128), (5000, 1000, 64), (77, 3, 32), (0, 1, 32)],
)
def test_reduce_sum_f32(gpu: EmulatorBackend, n: int, grid: int, block: int) -> None:
    x_host = np.random.default_rng(n).random(n, dtype=np.float32)
    x = upload(gpu, x_host) if n else gpu.malloc(4)
    out = upload(gpu, np.array([10.0], dtype=np.float32))
    gpu.launch(
        fn(gpu, "reduce_sum_f32"),
        (grid, 1, 1),
        (block, 1, 1),
        4 * block,
        None,
        pack("QQQ", out, x, n),
    )
    gpu.synchronize()
    got = download(gpu, out, np.float32, 1)[0]
    assert got == pytest.approx(10.0 + float(x_host.astype(np.float64).sum()), rel=1e-5)


def test_reduce_sum_follows_the_hip_kernel_exactly(gpu: EmulatorBackend) -> None:
    # block.x = 3 is not a power of two: the source's tree drops partial[2], and so must
    # the emulator, so that results match a GPU's.
    x = upload(gpu, np.arange(1, 7, dtype=np.float32))  # 1..6
    out = upload(gpu, np.zeros(1, dtype=np.float32))
    gpu.launch(fn(gpu, "reduce_sum_f32"), (1, 1, 1), (3, 1, 1), 12, None, pack("QQQ", out, x, 6))
    # threads: t0 = 1+4, t1 = 2+5, t2 = 3+6 (dropped by the tree): 5 + 7
    assert download(gpu, out, np.float32, 1)[0] == 12.0


def test_reduce_sum_adds_in_the_threads_order(gpu: EmulatorBackend) -> None:
    # One thread adds x[0], x[1], ... in order; float32 rounding makes the order visible
    # (a pairwise sum of these values differs).
    values = np.random.default_rng(5).random(3000, dtype=np.float32) * np.float32(1e4)
    values[0] = np.float32(1e8)
    expected = np.float32(0.0)
    for v in values:
        expected = np.float32(expected + v)
    x, out = upload(gpu, values), upload(gpu, np.zeros(1, dtype=np.float32))
    gpu.launch(fn(gpu, "reduce_sum_f32"), (1, 1, 1), (1, 1, 1), 4, None, pack("QQQ", out, x, 3000))
    assert download(gpu, out, np.float32, 1)[0] == expected


def test_reduce_sum_without_shared_memory_faults(gpu: EmulatorBackend) -> None:
    x = upload(gpu, np.ones(8, dtype=np.float32))
    out = upload(gpu, np.zeros(1, dtype=np.float32))
    gpu.launch(fn(gpu, "reduce_sum_f32"), (1, 1, 1), (64, 1, 1), 0, None, pack("QQQ", out, x, 8))
    with raises(E.hipErrorIllegalAddress) as info:
        gpu.synchronize()
    assert "shared_mem" in info.value.message


# The values the lead asked for: every width, sign and a struct with inner padding.
A8, A32, F, D, A16 = -7, 123456, 1.5, 2.25, -300
SA, SB, SC = 3, 0.125, -2


def probe_expected(n: int) -> np.ndarray:
    # The HIP source's left-to-right double arithmetic, float promoted to double.
    base = float(A8) + float(A32) + float(F) + D + float(A16) + float(SA) + SB + float(SC)
    return base + np.arange(n, dtype=np.float64)


def test_mixed_args_probe_with_hand_packed_args(gpu: EmulatorBackend) -> None:
    n = 50
    out = gpu.malloc(8 * n)
    args = pack("Qb3xif4xdh6xb7xdh6xQ", out, A8, A32, F, D, A16, SA, SB, SC, n)
    assert len(args) == 72
    gpu.launch(fn(gpu, "mixed_args_probe"), (1, 1, 1), (64, 1, 1), 0, None, args)
    got = download(gpu, out, np.float64, n)
    assert np.array_equal(got, probe_expected(n))
    assert got[0] == -7 + 123456 + 1.5 + 2.25 - 300 + 3 + 0.125 - 2


def test_mixed_args_probe_with_the_client_packer(gpu: EmulatorBackend) -> None:
    args_mod = pytest.importorskip("hipr.kernels.kernel_args")

    class ProbeStruct(ctypes.Structure):
        _fields_ = [("a", ctypes.c_byte), ("b", ctypes.c_double), ("c", ctypes.c_short)]

    class Ptr(int):
        is_device_pointer = True

    n = 7
    out = gpu.malloc(8 * n)
    packed = args_mod.pack_args(
        [
            Ptr(out),
            np.int8(A8),
            np.int32(A32),
            np.float32(F),
            np.float64(D),
            np.int16(A16),
            ProbeStruct(SA, SB, SC),
            np.uint64(n),
        ]
    )
    gpu.launch(fn(gpu, "mixed_args_probe"), (1, 1, 1), (1, 1, 1), 0, None, packed.data)
    assert np.array_equal(download(gpu, out, np.float64, n), probe_expected(n))


def test_launch_refuses_bad_arguments_and_geometry(gpu: EmulatorBackend) -> None:
    fill = fn(gpu, "fill_f32")
    ptr = gpu.malloc(16)
    good = pack("Qf4xQ", ptr, 1.0, 4)
    for args in (good[:-1], good + b"\0", pack("QfQ", ptr, 1.0, 4)[:20], b""):
        with raises(E.hipErrorInvalidValue) as info:
            gpu.launch(fill, (1, 1, 1), (1, 1, 1), 0, None, args)
        assert "24 bytes" in info.value.message
    for grid, block in (
        ((0, 1, 1), (1, 1, 1)),
        ((1, 1, 1), (1, 0, 1)),
        ((1, 1, 1), (1025, 1, 1)),
        ((1, 1, 1), (32, 32, 2)),
        ((-1, 1, 1), (1, 1, 1)),
    ):
        with raises(E.hipErrorInvalidConfiguration):
            gpu.launch(fill, grid, block, 0, None, good)
    with raises(E.hipErrorInvalidValue):
        gpu.launch(fill, (1, 1), (1, 1, 1), 0, None, good)  # type: ignore[arg-type]
    with raises(E.hipErrorInvalidValue):
        gpu.launch(fill, (1, 1, 1), (1, 1, 1), 1 << 20, None, good)
    with raises(E.hipErrorInvalidValue):
        gpu.launch(fill, (1, 1, 1), (1, 1, 1), -1, None, good)
    gpu.synchronize()
    assert not download(gpu, ptr, np.float32, 4).any()


def test_only_small_launches_are_offered_to_the_event_loop(gpu: EmulatorBackend) -> None:
    quick = gpu.inline_when["launch"]
    fill = fn(gpu, "fill_f32")
    ptr = gpu.malloc(4)
    limit = EmulatorBackend.INLINE_KERNEL_ELEMENTS
    one, block = (1, 1, 1), (1024, 1, 1)
    assert quick(fill, one, one, 0, None, pack("Qf4xQ", ptr, 1.0, 1))
    assert quick(fill, (limit // 1024, 1, 1), block, 0, None, pack("Qf4xQ", ptr, 1.0, limit))
    # Too many elements, too many threads: the session's GPU thread runs it.
    assert not quick(fill, one, one, 0, None, pack("Qf4xQ", ptr, 1.0, limit + 1))
    assert not quick(fill, (limit // 1024 + 1, 1, 1), block, 0, None, pack("Qf4xQ", ptr, 1.0, 1))
    # What launch() refuses is left to it, for its error.
    assert not quick(fill, one, one, 0, None, pack("Qf4xQ", ptr, 1.0, 1)[:-1])
    assert not quick("not a function", one, one, 0, None, pack("Qf4xQ", ptr, 1.0, 1))
    assert not quick(fill, (1, 1), one, 0, None, pack("Qf4xQ", ptr, 1.0, 1))


def test_batched_small_copies_land_in_order_and_only_small_batches_run_inline(
    gpu: EmulatorBackend,
) -> None:
    ptr = gpu.malloc(16)
    src = bytearray(b"abcdefgh")
    # Two pieces to one place: the later one wins, as two copies in a row would.
    gpu.memcpy_htod_many(
        [(ptr, memoryview(src)[:4]), (ptr + 4, memoryview(src)[4:]), (ptr, memoryview(b"WXYZ"))]
    )
    out = bytearray(8)
    gpu.memcpy_dtoh(memoryview(out), ptr)
    assert bytes(out) == b"WXYZefgh"
    with raises(E.hipErrorInvalidValue):  # a piece outside the allocation
        gpu.memcpy_htod_many([(ptr + 12, memoryview(bytes(8)))])
    quick = gpu.inline_when["memcpy_htod_many"]
    limit = EmulatorBackend.INLINE_COPY_BYTES
    assert quick([(ptr, memoryview(bytes(limit // 2)))] * 2)
    assert not quick([(ptr, memoryview(bytes(limit // 2)))] * 3)


def test_illegal_address_surfaces_at_the_next_synchronize_then_clears(
    gpu: EmulatorBackend,
) -> None:
    fill = fn(gpu, "fill_f32")
    ptr = gpu.malloc(16)
    # 5 floats into a 4-float allocation: the launch itself succeeds, like HIP's.
    gpu.launch(fill, (1, 1, 1), (32, 1, 1), 0, None, pack("Qf4xQ", ptr, 1.0, 5))
    assert gpu.stream_query(None)
    with raises(E.hipErrorIllegalAddress):
        gpu.synchronize()
    gpu.synchronize()  # cleared
    assert not download(gpu, ptr, np.float32, 4).any()

    stream, event = gpu.stream_create(), gpu.event_create()
    gpu.launch(fill, (1, 1, 1), (1, 1, 1), 0, stream, pack("Qf4xQ", 0xDEAD000, 1.0, 1))
    with raises(E.hipErrorIllegalAddress):
        gpu.stream_synchronize(stream)
    gpu.stream_synchronize(stream)

    gpu.free(ptr)  # a stale pointer faults too
    gpu.launch(fill, (1, 1, 1), (1, 1, 1), 0, stream, pack("Qf4xQ", ptr, 1.0, 1))
    with raises(E.hipErrorIllegalAddress):
        gpu.event_synchronize(event)
    gpu.event_synchronize(event)


def test_pending_errors_are_per_device() -> None:
    gpu = EmulatorBackend(device_count=2, total_memory=MiB)
    gpu.bind_thread(1)
    fill = gpu.module_get_function(gpu.builtin_module(), "fill_f32")
    gpu.launch(fill, (1, 1, 1), (1, 1, 1), 0, None, pack("Qf4xQ", 12345, 1.0, 1))
    gpu.bind_thread(0)
    gpu.synchronize()  # device 0 is clean
    gpu.bind_thread(1)
    with raises(E.hipErrorIllegalAddress):
        gpu.synchronize()


def test_kernel_pointer_of_another_device_faults() -> None:
    gpu = EmulatorBackend(device_count=2, total_memory=MiB)
    ptr = gpu.malloc(16)  # device 0
    gpu.bind_thread(1)
    fill = gpu.module_get_function(gpu.builtin_module(), "fill_f32")
    gpu.launch(fill, (1, 1, 1), (1, 1, 1), 0, None, pack("Qf4xQ", ptr, 1.0, 4))
    with raises(E.hipErrorIllegalAddress):
        gpu.synchronize()
    gpu.bind_thread(0)  # the function belongs to device 1's module
    with raises(E.hipErrorInvalidDeviceFunction):
        gpu.launch(fill, (1, 1, 1), (1, 1, 1), 0, None, pack("Qf4xQ", ptr, 1.0, 4))


# --- graphs -----------------------------------------------------------------------------


def test_graph_by_stream_capture(gpu: EmulatorBackend) -> None:
    n = 16
    stream = gpu.stream_create()
    x, y = gpu.malloc(4 * n), gpu.malloc(4 * n)
    host = np.arange(n, dtype=np.float32)
    gpu.stream_begin_capture(stream)
    gpu.memset(x, 0xFF, 4 * n, stream)
    gpu.memcpy_htod(x, host.data, stream)
    host[:] = -1  # the captured node owns a copy of the bytes
    gpu.launch(fn(gpu, "scale_f32"), (1, 1, 1), (32, 1, 1), 0, stream, pack("Qf4xQ", x, 2.0, n))
    gpu.memcpy_dtod(y, x, 4 * n, stream)
    # Captured, not run.
    assert not download(gpu, x, np.float32, n).any()
    graph = gpu.stream_end_capture(stream)
    graph_exec = gpu.graph_instantiate(graph)
    assert gpu.stats().graphs == 1 and gpu.stats().graph_execs == 1
    gpu.graph_launch(graph_exec, stream)
    gpu.stream_synchronize(stream)
    assert np.array_equal(download(gpu, y, np.float32, n), np.arange(n, dtype=np.float32) * 2)
    gpu.graph_launch(graph_exec, None)  # replays from the start: same result
    assert np.array_equal(download(gpu, y, np.float32, n), np.arange(n, dtype=np.float32) * 2)
    # After capture the stream runs work again.
    gpu.memset(x, 0, 4 * n, stream)
    assert not download(gpu, x, np.float32, n).any()
    gpu.graph_exec_destroy(graph_exec)
    gpu.graph_destroy(graph)
    assert gpu.stats().graphs == 0 and gpu.stats().graph_execs == 0


def test_graph_launched_during_capture_is_captured(gpu: EmulatorBackend) -> None:
    ptr = gpu.malloc(4)
    inner = gpu.graph_create()
    gpu.graph_add_memset(inner, [], ptr, 7, 4)
    inner_exec = gpu.graph_instantiate(inner)
    stream = gpu.stream_create()
    gpu.stream_begin_capture(stream)
    gpu.memset(ptr, 1, 4, stream)
    gpu.graph_launch(inner_exec, stream)
    outer = gpu.stream_end_capture(stream)
    assert bytes(download(gpu, ptr, np.uint8, 4)) == b"\0" * 4
    gpu.graph_launch(gpu.graph_instantiate(outer), stream)
    assert bytes(download(gpu, ptr, np.uint8, 4)) == b"\x07" * 4


def test_capture_rules(gpu: EmulatorBackend) -> None:
    with raises(E.hipErrorStreamCaptureUnsupported):
        gpu.stream_begin_capture(None)
    stream = gpu.stream_create()
    with raises(E.hipErrorIllegalState):
        gpu.stream_end_capture(stream)
    gpu.stream_begin_capture(stream)
    with raises(E.hipErrorIllegalState):
        gpu.stream_begin_capture(stream)
    ptr = gpu.malloc(8)
    with raises(E.hipErrorInvalidValue):  # still checked at capture time
        gpu.memset(ptr, 0, 9, stream)
    with raises(E.hipErrorStreamCaptureUnsupported):
        gpu.memcpy_dtoh(memoryview(bytearray(8)), ptr, stream)
    with raises(E.hipErrorStreamCaptureInvalidated):
        gpu.stream_end_capture(stream)
    with raises(E.hipErrorIllegalState):  # the failed end still ended the capture
        gpu.stream_end_capture(stream)
    gpu.stream_begin_capture(stream)
    with raises(E.hipErrorStreamCaptureUnsupported):
        gpu.stream_synchronize(stream)
    with raises(E.hipErrorStreamCaptureInvalidated):
        gpu.stream_end_capture(stream)
    gpu.stream_begin_capture(stream)
    empty = gpu.stream_end_capture(stream)
    gpu.graph_launch(gpu.graph_instantiate(empty), None)
    gpu.stream_begin_capture(stream)
    gpu.stream_destroy(stream)  # discards the capture
    assert gpu.stats().streams == 0


def test_explicit_graph_with_a_diamond(gpu: EmulatorBackend) -> None:
    n = 64
    x, y, z, out = (gpu.malloc(4 * n) for _ in range(4))
    fill, add = fn(gpu, "fill_f32"), fn(gpu, "vector_add_f32")
    graph = gpu.graph_create()
    a = gpu.graph_add_kernel(graph, [], fill, (1, 1, 1), (64, 1, 1), 0, pack("Qf4xQ", x, 2.0, n))
    b = gpu.graph_add_memcpy(graph, [a], y, x, 4 * n)
    c = gpu.graph_add_kernel(graph, [a], add, (1, 1, 1), (64, 1, 1), 0, pack("QQQQ", z, x, x, n))
    d = gpu.graph_add_kernel(
        graph, [b, c], add, (2, 1, 1), (32, 1, 1), 0, pack("QQQQ", out, y, z, n)
    )
    assert len({id(a), id(b), id(c), id(d)}) == 4
    graph_exec = gpu.graph_instantiate(graph)
    # The exec is a snapshot: a node added now is not in it.
    gpu.graph_add_memset(graph, [d], out, 0, 4 * n)
    gpu.graph_launch(graph_exec, None)
    gpu.synchronize()
    assert np.array_equal(download(gpu, out, np.float32, n), np.full(n, 6.0, np.float32))
    # The exec outlives its graph.
    gpu.graph_destroy(graph)
    gpu.memset(out, 0, 4 * n)
    gpu.graph_launch(graph_exec, gpu.stream_create())
    assert np.array_equal(download(gpu, out, np.float32, n), np.full(n, 6.0, np.float32))
    with raises(E.hipErrorInvalidHandle):
        gpu.graph_add_memset(graph, [], out, 0, 4)
    gpu.graph_exec_destroy(graph_exec)
    with raises(E.hipErrorInvalidHandle):
        gpu.graph_launch(graph_exec, None)
    with raises(E.hipErrorInvalidHandle):
        gpu.graph_exec_destroy(graph_exec)


def test_graph_node_validation(gpu: EmulatorBackend) -> None:
    ptr = gpu.malloc(16)
    g1, g2 = gpu.graph_create(), gpu.graph_create()
    foreign = gpu.graph_add_memset(g2, [], ptr, 0, 16)
    for deps in ([foreign], [gpu.stream_create()], [None]):
        with raises(E.hipErrorInvalidValue):
            gpu.graph_add_memset(g1, deps, ptr, 0, 16)
    with raises(E.hipErrorInvalidValue):
        gpu.graph_add_memset(g1, [], ptr, 0, 17)
    with raises(E.hipErrorInvalidValue):
        gpu.graph_add_memcpy(g1, [], ptr, ptr + 8, 9)
    with raises(E.hipErrorInvalidValue):
        gpu.graph_add_kernel(g1, [], fn(gpu, "fill_f32"), (1, 1, 1), (1, 1, 1), 0, b"short")
    with raises(E.hipErrorInvalidConfiguration):
        gpu.graph_add_kernel(
            g1, [], fn(gpu, "fill_f32"), (1, 1, 1), (2048, 1, 1), 0, pack("Qf4xQ", ptr, 1, 1)
        )
    # A node added twice as a dependency is one dependency.
    first = gpu.graph_add_memset(g1, [], ptr, 1, 16)
    gpu.graph_add_memset(g1, [first, first], ptr, 2, 8)
    gpu.graph_launch(gpu.graph_instantiate(g1), None)
    assert bytes(download(gpu, ptr, np.uint8, 16)) == b"\x02" * 8 + b"\x01" * 8


def test_graph_replay_fault_is_asynchronous(gpu: EmulatorBackend) -> None:
    a, b = gpu.malloc(16), gpu.malloc(16)
    graph = gpu.graph_create()
    first = gpu.graph_add_memcpy(graph, [], a, b, 16)
    gpu.graph_add_memset(graph, [first], b, 5, 16)
    graph_exec = gpu.graph_instantiate(graph)
    gpu.free(a)
    gpu.graph_launch(graph_exec, None)
    with raises(E.hipErrorIllegalAddress):
        gpu.synchronize()
    # The replay stopped at the faulting node.
    assert not download(gpu, b, np.uint8, 16).any()


# --- accounting -----------------------------------------------------------------------


def test_stats_and_close() -> None:
    gpu = EmulatorBackend(device_count=2, total_memory=MiB)
    gpu.malloc(100)
    gpu.bind_thread(1)
    gpu.malloc(200)
    stream = gpu.stream_create()
    gpu.event_create()
    gpu.builtin_module()
    graph = gpu.graph_create()
    gpu.graph_instantiate(graph)
    gpu.stream_begin_capture(stream)
    gpu.stream_end_capture(stream)
    assert gpu.stats() == BackendStats(
        allocations=2,
        allocated_bytes=300,
        streams=1,
        events=1,
        modules=0,  # the shared built-in module is the backend's own
        graphs=2,
        graph_execs=1,
    )
    gpu.close()
    assert gpu.stats().is_zero()
    assert gpu.mem_get_info() == (MiB, MiB)
    with raises(E.hipErrorDeinitialized):
        gpu.malloc(1)
    with raises(E.hipErrorDeinitialized):
        gpu.stream_create()
    with raises(E.hipErrorInvalidHandle):
        gpu.stream_synchronize(stream)
    gpu.close()  # idempotent
