"""The native proxy's C, checked from C: a program covering memory, copies, streams,
events, errors and launches (kernelParams of mixed widths, `extra`) against an emulator
worker, built with the proxy libraries under AddressSanitizer (leak checking on) and
UndefinedBehaviorSanitizer; a fuzz harness feeding malformed, truncated and oversized
frames to the core's decoder under the same sanitizers; the build's own facts (symbol
versions, generated tables, opcodes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hipr.protocol.opcodes import Opcode
from hipr.proxy.build import (
    HIP_LIBRARY,
    LIB_DIR,
    NATIVE,
    RTC_LIBRARY,
)
from hipr.proxy.coverage import coverage, update
from hipr.proxy.tables import loaded_symbols, render_tables
from tests.proxy.sanitized import (
    SANITIZED_FLAGS,
    SANITIZER_ENV,
    assert_sanitizer_clean,
    cc,
    linked_to,
    run_clean,
)

C_DIR = Path(__file__).resolve().parent / "c"


def test_c_program_under_sanitizers(sanitized_libs: Path, worker_url: str, tmp_path: Path) -> None:
    libs = sanitized_libs
    program = tmp_path / "proxy_check"
    cc(
        [
            *SANITIZED_FLAGS, str(C_DIR / "proxy_check.c"), "-o", str(program),
            *linked_to(libs, HIP_LIBRARY), "-lm",
        ]
    )  # fmt: skip
    run_clean(program, timeout=120, HIPR_URL=worker_url)


def test_hipcc_path_and_extras_under_sanitizers(
    sanitized_libs: Path, worker_url: str, tmp_path: Path
) -> None:
    """hipcc's registration (before main), configuration stack and hipLaunchKernel, from
    four threads at once; R0000 properties, host allocations, pointer attributes, stream
    flags, capture into a graph, hipExtModuleLaunchKernel (tests/proxy/c/hipcc_check.c)."""
    libs = sanitized_libs
    program = tmp_path / "hipcc_check"
    cc(
        [
            *SANITIZED_FLAGS, str(C_DIR / "hipcc_check.c"), "-o", str(program),
            *linked_to(libs, HIP_LIBRARY), "-pthread",
        ]
    )  # fmt: skip
    env = dict(os.environ, HIPR_URL=worker_url, **SANITIZER_ENV)
    env.pop("HIPCC_CHECK_IMAGE", None)
    result = subprocess.run(
        [str(program)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok"


def _harness_runs(
    tmp_path: Path, program: str, sources: tuple[str, ...], iterations: str
) -> list[subprocess.CompletedProcess[str]]:
    """A C harness of tests/proxy/c built with the core's ``sources`` and libcbor under
    the sanitizers, run clean for two seeds."""
    harness = tmp_path / program
    cc(
        [
            *SANITIZED_FLAGS, f"-I{NATIVE}", str(C_DIR / f"{program}.c"),
            *(str(NATIVE / source) for source in sources), "-lcbor", "-o", str(harness),
        ]
    )  # fmt: skip
    env = dict(os.environ, **SANITIZER_ENV)
    runs = []
    for seed in ("1", "977"):
        result = subprocess.run(
            [str(harness), iterations, seed], env=env, capture_output=True, text=True, timeout=120
        )
        assert_sanitizer_clean(result)
        runs.append(result)
    return runs


def test_decoder_fuzz_under_sanitizers(proxy_libs: None, tmp_path: Path) -> None:
    for result in _harness_runs(tmp_path, "fuzz_wire", ("wire.c", "cborx.c"), "6000"):
        counts = [int(n) for n in re.findall(r"\d+", result.stdout)]
        # Every kind of stream was exercised: frames decoded, streams refused, clean ones.
        assert result.stdout.startswith("ok") and all(n > 0 for n in counts), result.stdout


def test_launch_maps_written_directly_match_libcbor(proxy_libs: None, tmp_path: Path) -> None:
    """The launch requests' CBOR written straight into a buffer (launch_cbor.c) decodes
    to the map libcbor builds, for configurations of every width, one launch or many;
    a room too small is refused without a byte written past it."""
    for result in _harness_runs(
        tmp_path, "launch_cbor_check", ("launch_cbor.c", "wire.c", "cborx.c"), "1500"
    ):
        assert result.stdout.strip() == "ok", result.stderr


def test_pointer_set_agrees_with_a_plain_array(tmp_path: Path) -> None:
    """The set behind the CUDA front's per-launch handle checks (ptr_set.c)."""
    harness = tmp_path / "ptr_set_check"
    cc(
        [
            *SANITIZED_FLAGS, f"-I{NATIVE}", str(C_DIR / "ptr_set_check.c"),
            str(NATIVE / "ptr_set.c"), "-o", str(harness),
        ]
    )  # fmt: skip
    env = dict(os.environ, **SANITIZER_ENV)
    result = subprocess.run(
        [str(harness), "200000"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert_sanitizer_clean(result)
    adds, removes, looks = (int(n) for n in result.stdout.split()[1:])
    assert result.stdout.startswith("ok") and min(adds, removes, looks) > 10_000, result.stdout


def test_symbol_versions_and_sonames(proxy_libs: None) -> None:
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(LIB_DIR / "libamdhip64.so")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert re.search(r" hipMalloc@@hip_4\.2$", symbols, re.M)
    assert re.search(r" hipGetDevicePropertiesR0600@@hip_6\.0$", symbols, re.M)
    assert re.search(r" hipModuleLaunchKernel@@hip_4\.2$", symbols, re.M)
    # Nothing of the core leaks out but its private, versioned entry points.
    for line in symbols.splitlines():
        name = line.split()[-1]
        assert name.startswith(("hip", "__hip", "HIPR_PRIVATE", "hip_")), name
    rtc = subprocess.run(
        ["readelf", "-d", str(LIB_DIR / "libhiprtc.so")], capture_output=True, text=True, check=True
    ).stdout
    assert "[libamdhip64.so]" in rtc and "$ORIGIN" in rtc


def _exported(library: str) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(LIB_DIR / library)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {line.split()[-1].split("@")[0] for line in out.splitlines()}


def test_every_function_hip_python_loads_is_exported(proxy_libs: None) -> None:
    """What hip-python dlsyms from libamdhip64.so and libhiprtc.so exists in the proxy's,
    so that a program or library linked against those names loads."""
    for library, module in (("libamdhip64.so", "hip"), ("libhiprtc.so", "hiprtc")):
        missing = set(loaded_symbols(module)) - _exported(library)
        assert not missing, (library, sorted(missing))


UNSERVED = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
calls = [lib.hipMallocArray(None, None, 1, 1, 0) for _ in range(3)]
calls.append(lib.hipGetLastError())
print(*calls)
"""


def test_an_unserved_function_returns_not_supported_and_says_so_once(proxy_libs: None) -> None:
    result = subprocess.run(
        [sys.executable, "-c", UNSERVED, str(LIB_DIR / "libamdhip64.so")],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.stdout.split() == ["801", "801", "801", "801"], result.stderr
    assert result.stderr.count("hipMallocArray is not served") == 1, result.stderr


def test_generated_tables_are_current() -> None:
    for name, text in render_tables().items():
        assert (NATIVE / name).read_text() == text, f"run scripts/gen-proxy-tables ({name})"
    doc = Path(__file__).resolve().parents[2] / "docs" / "proxy.md"
    assert update(doc) == doc.read_text(), "run scripts/gen-proxy-tables (docs/proxy.md)"
    served = {name for name, _, status in coverage() if status == "served"}
    # What hip-python's hip and hiprtc examples call, served.
    assert {
        "hipGetDevicePropertiesR0600",
        "hipDeviceGetAttribute",
        "hipMalloc",
        "hipMemcpy",
        "hipMemcpyAsync",
        "hipMemsetAsync",
        "hipStreamCreate",
        "hipStreamSynchronize",
        "hipStreamDestroy",
        "hipFree",
        "hipModuleLoadData",
        "hipModuleGetFunction",
        "hipModuleLaunchKernel",
        "hipModuleUnload",
        "hiprtcCreateProgram",
        "hiprtcCompileProgram",
        "hiprtcGetProgramLogSize",
        "hiprtcGetProgramLog",
        "hiprtcGetCodeSize",
        "hiprtcGetCode",
        "hiprtcDestroyProgram",
    } <= served


def test_every_function_hipr_hip_serves_the_proxy_serves() -> None:
    from hipr.facade.hip_names import SUPPORTED

    served = {name for name, _, status in coverage() if status == "served"}
    assert set(SUPPORTED) - served == set()


def test_opcodes_match_the_protocol() -> None:
    header = (NATIVE / "opcodes.h").read_text()
    defined = dict(re.findall(r"#define OP_(\w+) (0x[0-9a-fA-F]+)", header))
    assert defined
    for name, value in defined.items():
        assert Opcode[name].value == int(value, 16), name


def test_hiprtc_link_headers_globals_and_stream_devices_under_sanitizers(
    sanitized_libs: Path, tmp_path: Path
) -> None:
    """libhiprtc.so's headers, bitcode and linking (the emulator refuses the compile and
    the link, with its reason in the logs), hipModuleGetGlobal on the built-in module, and
    each stream's device on a worker of two devices (tests/proxy/c/front_check.c)."""
    from tests.proxy.conftest import start_worker, stop_worker

    libs = sanitized_libs
    program = tmp_path / "front_check"
    cc(
        [
            *SANITIZED_FLAGS, str(C_DIR / "front_check.c"), "-o", str(program),
            *linked_to(libs, HIP_LIBRARY, RTC_LIBRARY),
            "-pthread",
        ]
    )  # fmt: skip
    directory = tmp_path / "w"
    directory.mkdir()
    process, url = start_worker(directory, "[emulator]\ndevice_count = 2\n")
    try:
        env = dict(os.environ, HIPR_URL=url, **SANITIZER_ENV)
        env.pop("FRONT_CHECK_GPU", None)
        result = subprocess.run(
            [str(program)], env=env, capture_output=True, text=True, timeout=120, check=False
        )
    finally:
        stop_worker(process)
    assert_sanitizer_clean(result)
    assert result.stdout.splitlines() == ["streams on 2 device(s): ok", "ok"]
