"""hipr.backends._direct_calls against a stand-in driver library built here: the ctypes
signatures pass every argument as the C driver API declares it, result codes come back
as they are, and a library that is not loaded (or lacks the calls) gives no direct
calls, so the bindings serve."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from hipr.backends._direct_calls import load_direct_calls

FAKE_DRIVER = r"""
#include <stdint.h>
typedef int CUresult;
/* What the last launch received, for the test to read. */
uintptr_t last_function, last_stream, last_params, last_extra;
unsigned last_dims[7];
CUresult launch_result, query_result;
uintptr_t last_queried;

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, void *stream,
                        void **params, void **extra) {
    last_function = (uintptr_t)f; last_stream = (uintptr_t)stream;
    last_params = (uintptr_t)params; last_extra = (uintptr_t)extra;
    unsigned dims[7] = {gx, gy, gz, bx, by, bz, shared};
    for (int i = 0; i < 7; i++) last_dims[i] = dims[i];
    return launch_result;
}

CUresult cuStreamQuery(void *stream) { last_queried = (uintptr_t)stream; return query_result; }
"""


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ctypes.CDLL]:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("a C compiler is needed (scripts/setup installs one)")
    folder = tmp_path_factory.mktemp("fake-driver")
    source = folder / "fake_cuda.c"
    source.write_text(FAKE_DRIVER)
    library = folder / "libfakecuda.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(library), str(source)],
        check=True,
        timeout=60,
    )
    # Loaded as cuda-bindings loads the driver, before the direct calls are asked for.
    return str(library), ctypes.CDLL(str(library))


def test_launch_passes_every_argument_as_the_driver_declares_it(
    fake_driver: tuple[str, ctypes.CDLL],
) -> None:
    path, lib = fake_driver
    calls = load_direct_calls(path, "cuLaunchKernel", "cuStreamQuery")
    assert calls is not None
    extra = (ctypes.c_void_p * 5)()
    function, stream = 0x7F00_1234_5678_9ABC, 0x5555_0000_1111_2222
    dims = (65535, 2, 3, 1024, 1, 64)
    err = calls.launch(function, *dims, 49152, stream, None, ctypes.addressof(extra))
    assert err == 0
    assert ctypes.c_size_t.in_dll(lib, "last_function").value == function
    assert ctypes.c_size_t.in_dll(lib, "last_stream").value == stream
    assert ctypes.c_size_t.in_dll(lib, "last_params").value == 0
    assert ctypes.c_size_t.in_dll(lib, "last_extra").value == ctypes.addressof(extra)
    assert list((ctypes.c_uint * 7).in_dll(lib, "last_dims")) == [*dims, 49152]
    # Unsigned dimensions: the largest grid the driver API can express arrives whole.
    calls.launch(function, 2**32 - 1, 1, 1, 1, 1, 1, 0, None, None, None)
    assert (ctypes.c_uint * 7).in_dll(lib, "last_dims")[0] == 2**32 - 1
    assert ctypes.c_size_t.in_dll(lib, "last_stream").value == 0  # the null stream


def test_result_codes_come_back_unchanged(fake_driver: tuple[str, ctypes.CDLL]) -> None:
    path, lib = fake_driver
    calls = load_direct_calls(path, "cuLaunchKernel", "cuStreamQuery")
    assert calls is not None
    ctypes.c_int.in_dll(lib, "launch_result").value = 701  # CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    ctypes.c_int.in_dll(lib, "query_result").value = 600  # CUDA_ERROR_NOT_READY
    try:
        assert calls.launch(1, 1, 1, 1, 1, 1, 1, 0, 2, None, None) == 701
        assert calls.stream_query(0xABC) == 600
        assert ctypes.c_size_t.in_dll(lib, "last_queried").value == 0xABC
    finally:
        ctypes.c_int.in_dll(lib, "launch_result").value = 0
        ctypes.c_int.in_dll(lib, "query_result").value = 0
    assert calls.stream_query(0xABC) == 0


def test_no_direct_calls_without_the_loaded_library_or_its_calls(
    fake_driver: tuple[str, ctypes.CDLL], tmp_path: Path
) -> None:
    path, _ = fake_driver
    # Never loaded in this process: the bindings' library is the only one used.
    assert load_direct_calls(str(tmp_path / "libnotloaded.so"), "cuLaunchKernel", "x") is None
    assert load_direct_calls(path, "cuLaunchKernel", "cuNoSuchQuery") is None
    assert load_direct_calls(path, "cuNoSuchLaunch", "cuStreamQuery") is None


def test_simulated_bindings_get_no_direct_calls() -> None:
    """Tests that run the cuda adapter on simulated bindings see every call."""
    from hipr.backends._runtime_cuda import CudaRuntime

    class Simulated:
        __name__ = "tests.simulated_driver"

    assert CudaRuntime(driver=Simulated(), nvrtc=object()).direct_calls() is None
