"""Unmodified hip-python programs through ``hipr run`` (the native proxy) against an
emulator worker, compared with the same programs through ``from hipr import hip``; the
proxy's behaviour without a worker, with tokens, across fork and threads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hipr.worker.tenants import new_token, token_hash
from tests.proxy.conftest import run_python, start_worker, stop_worker
from tests.proxy.programs import (
    ALL_PROPS,
    BASICS,
    BUILTIN_LAUNCH,
    HIP_PYTHON,
    HIPR,
    HIPRTC_COMPILE,
)

pytest.importorskip("hip", reason="hip-python is not installed")


def _ok(result: object) -> str:
    assert getattr(result, "returncode", None) == 0, getattr(result, "stderr", "")
    return str(getattr(result, "stdout", ""))


def test_hip_python_matches_hipr_hip(worker_url: str) -> None:
    program = BASICS.replace("IMPORT", HIP_PYTHON)
    through_proxy = json.loads(_ok(run_python(program, url=worker_url, via_cli=True)))
    through_hipr = json.loads(
        _ok(run_python(BASICS.replace("IMPORT", HIPR), url=worker_url, proxied=False))
    )
    assert through_proxy == through_hipr
    # And the values are the worker's, not two equal wrong answers.
    assert through_proxy["count"] == 1 and through_proxy["device"] == 0
    assert through_proxy["name"] == repr("hipr emulator") and through_proxy["warpSize"] == "64"
    assert through_proxy["maxThreadsDim"] == [1024, 1024, 1024]
    assert through_proxy["roundtrip"][:3] == [0.0, 0.0, 1.0] and through_proxy["zeroed"]
    assert through_proxy["bad_device"] == 101 and through_proxy["last"] == 101
    assert through_proxy["last_again"] == 0 and through_proxy["elapsed_ok"]


def test_every_property_has_hip_pythons_value_and_type(worker_url: str) -> None:
    """hipr.hip's hipDeviceProp_t against hip-python's own, field by field: strings as
    str (hip-python 10), arrays as lists of the C field's length, luid as bytes, uuid and
    arch as struct objects."""
    through_proxy = _ok(run_python(ALL_PROPS.replace("IMPORT", HIP_PYTHON), url=worker_url))
    through_hipr = _ok(run_python(ALL_PROPS.replace("IMPORT", HIPR), url=worker_url, proxied=False))
    assert through_proxy.splitlines() == through_hipr.splitlines()
    lines = dict(line.split(" ", 1) for line in through_proxy.splitlines())
    assert len(lines) > 100
    assert lines["name"] == "str 'hipr emulator'" and lines["gcnArchName"] == "str 'emu'"
    assert lines["maxTexture2D"] == "list [0, 0]" and lines["luid"].startswith("bytes b'")


def test_builtin_kernel_launch_with_extra(worker_url: str) -> None:
    assert _ok(run_python(BUILTIN_LAUNCH, url=worker_url)).split() == ["0.0", "1.5", "148.5"]


def test_hiprtc_on_a_worker_without_compiler(worker_url: str) -> None:
    program = HIPRTC_COMPILE.replace("IMPORT_RTC", "")
    proxied = _ok(run_python(program.replace("IMPORT", HIP_PYTHON), url=worker_url))
    facade = HIPRTC_COMPILE.replace("IMPORT_RTC", "from hipr import hiprtc").replace("IMPORT", HIPR)
    direct = _ok(run_python(facade, url=worker_url, proxied=False))
    assert proxied == direct
    result, log, destroyed = proxied.splitlines()
    assert result == "11"  # HIPRTC_ERROR_INTERNAL_ERROR: the worker cannot compile
    assert "no device compiler" in log and destroyed == "0"


NO_WORKER = r"""
from hip import hip
results = hip.hipGetDeviceCount()[0], hip.hipMalloc(64)[0], hip.hipDeviceSynchronize()[0]
print(*(int(r) for r in results))
"""


def test_without_a_worker_calls_fail_and_say_so_once(tmp_path: Path, proxy_libs: None) -> None:
    result = run_python(NO_WORKER, url=f"unix://{tmp_path}/nobody.sock", via_cli=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["100", "100", "100"]  # hipErrorNoDevice, no abort
    assert result.stderr.count("no worker answered") == 1, result.stderr


FORK = r"""
import array, os
from hip import hip
K = hip.hipMemcpyKind
def roundtrip(tag):
    x = array.array("i", range(64)); y = array.array("i", [0] * 64)
    err, d = hip.hipMalloc(256); assert err == 0, err
    assert hip.hipMemcpy(d, x, 256, K.hipMemcpyHostToDevice)[0] == 0
    assert hip.hipMemcpy(y, d, 256, K.hipMemcpyDeviceToHost)[0] == 0
    assert hip.hipFree(d)[0] == 0
    print(tag, list(y) == list(x), flush=True)
roundtrip("parent")
pid = os.fork()
if pid == 0:
    roundtrip("child")
    os._exit(0)
_, status = os.waitpid(pid, 0)
roundtrip("parent-again")
print("child-status", status)
"""


def test_fork_child_gets_its_own_session(worker_url: str) -> None:
    lines = _ok(run_python(FORK, url=worker_url)).splitlines()
    assert lines == ["parent True", "child True", "parent-again True", "child-status 0"]


THREADS = r"""
import threading
from hip import hip
seen = {}
def worker():
    bad = hip.hipSetDevice(1)[0]
    seen["thread"] = (hip.hipGetDevice()[1], int(bad), int(hip.hipPeekAtLastError()[0]))
assert hip.hipSetDevice(0)[0] == 0
t = threading.Thread(target=worker); t.start(); t.join()
print(seen["thread"], hip.hipGetDevice()[1], int(hip.hipPeekAtLastError()[0]))
"""


def test_current_device_and_last_error_are_per_thread(worker_url: str) -> None:
    # One device: the thread's hipSetDevice(1) fails, and only that thread sees the error.
    assert _ok(run_python(THREADS, url=worker_url)).strip() == "(0, 101, 101) 0 0"


TOKEN = r"""
from hip import hip
print(int(hip.hipGetDeviceCount()[0]))
"""


def test_tokens(tmp_path: Path, proxy_libs: None) -> None:
    token = new_token()
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(f'[tenants.alice]\ntokens = ["{token_hash(token)}"]\n')
    process, url = start_worker(tmp_path, f'tenants_file = "{tenants}"\n')
    try:
        good = tmp_path / "good"
        good.write_text(token + "\n")
        bad = tmp_path / "bad"
        bad.write_text(new_token())
        assert _ok(run_python(TOKEN, url=url, token_file=good, via_cli=True)).strip() == "0"
        refused = run_python(TOKEN, url=url, token_file=bad)
        assert refused.returncode == 0 and refused.stdout.strip() != "0"
        assert "refused HELLO" in refused.stderr
    finally:
        stop_worker(process)
