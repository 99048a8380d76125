"""Raw kernel argument bytes through the proxy cannot reach another tenant's memory with
``isolation = "process"`` (the mode docs/proxy.md recommends for several tenants): Bob
launches a kernel that reads from Alice's device address, and reads back none of her
data."""

from __future__ import annotations

import struct
from pathlib import Path

import hipr
from hipr.worker.tenants import new_token, token_hash
from tests.proxy.conftest import run_python, start_worker, stop_worker

BOB = r"""
import array, ctypes, sys
from hip import hip
alice = int(sys.argv[1])
n = 16
y = array.array("f", [0.0] * n)
err, y_d = hip.hipMalloc(4 * n); assert err == 0, err
assert hip.hipMemcpy(y_d, y, 4 * n, hip.hipMemcpyKind.hipMemcpyHostToDevice)[0] == 0
err, module = hip.hipModuleLoadData(b"hipr:builtin\0"); assert err == 0, err
err, axpy = hip.hipModuleGetFunction(module, b"axpy_f32"); assert err == 0, err
# y[i] += 1.0 * x[i], with x = Alice's allocation: the bytes carry her address.
extra = (y_d, ctypes.c_void_p(alice), ctypes.c_float(1.0), ctypes.c_uint64(n))
launched = hip.hipModuleLaunchKernel(axpy, 1, 1, 1, 32, 1, 1, sharedMemBytes=0, stream=None,
    kernelParams=None, extra=extra)[0]
synced = hip.hipDeviceSynchronize()[0]
assert hip.hipMemcpy(y, y_d, 4 * n, hip.hipMemcpyKind.hipMemcpyDeviceToHost)[0] == 0
print(int(launched), int(synced), list(y) == [0.0] * n, int(y_d) == alice)
"""


def test_bob_cannot_read_alice_through_raw_arguments(tmp_path: Path, proxy_libs: None) -> None:
    alice_token, bob_token = new_token(), new_token()
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(
        f'[tenants.alice]\ntokens = ["{token_hash(alice_token)}"]\n'
        f'[tenants.bob]\ntokens = ["{token_hash(bob_token)}"]\n'
    )
    process, url = start_worker(tmp_path, f'tenants_file = "{tenants}"\nisolation = "process"\n')
    try:
        with hipr.connect(url, token=alice_token) as alice:
            secret = alice.malloc_htod(struct.pack("16f", *range(1, 17)))
            bob_file = tmp_path / "bob"
            bob_file.write_text(bob_token)
            result = run_python(
                BOB.replace("sys.argv[1]", str(int(secret))), url=url, token_file=bob_file
            )
            assert result.returncode == 0, result.stderr
            launched, synced, untouched, same_address = result.stdout.split()
            # Bob's buffer holds none of Alice's floats. Either the address is none of
            # Bob's allocations, and the worker refuses the launch (reported at the next
            # synchronising call), or Bob's own process has an allocation at that very
            # address (each tenant's device context numbers its own memory), and the
            # kernel read Bob's zeros.
            assert launched == "0" and untouched == "True", result.stdout
            assert (synced != "0") or (same_address == "True"), result.stdout
            assert alice.memcpy_dtoh(secret, 64) == struct.pack("16f", *range(1, 17))
    finally:
        stop_worker(process)
