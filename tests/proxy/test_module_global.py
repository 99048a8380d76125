"""MODULE_GET_GLOBAL (0x050B): a loaded module's global variable, which the CUDA proxy's
cuModuleGetGlobal / cuLibraryGetGlobal ask for (cuBLAS does at handle creation). The
emulator's built-in module has one, `hipr_builtin_bias` (no `flag`); a backend gives the
address and size, the session's copies may then name those bytes until the module is
unloaded, and FREE refuses them. DEVICE_LIMIT (0x0107): cuCtxGetLimit's limit, read from
the backend. A cuda worker answers both from its driver (scripts/cuda-gpu-check on the GPU host)."""

from __future__ import annotations

from typing import Any

import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipError, HipErrorCode
from hipr.protocol.opcodes import Opcode
from hipr.testing.harness import RawClient, raw_client_to

pytestmark = pytest.mark.anyio


class GlobalsBackend(EmulatorBackend):
    """The emulator with one 64-byte global, `flag`, per module (its own device memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.globals: dict[int, int] = {}

    def module_global(self, module: Any, name: str) -> tuple[int, int]:
        if name != "flag":
            raise HipError(HipErrorCode.hipErrorNotFound, f"no global named {name!r}")
        if id(module) not in self.globals:
            self.globals[id(module)] = self.malloc(64)
        return self.globals[id(module)], 64


async def _refused(client: RawClient, opcode: int, args: Any, bulk: bytes = b"") -> int:
    with pytest.raises(HipError) as info:
        await client.call(opcode, args, bulk)
    return int(info.value.code)


async def test_the_emulator_has_only_the_builtin_variable(anyio_backend: str) -> None:
    async with raw_client_to(EmulatorBackend()) as client:
        module = (await client.call(Opcode.MODULE_BUILTIN, {"name": "fill_f32"}))["module"]
        args = {"module": module, "name": "flag"}
        code = await _refused(client, Opcode.MODULE_GET_GLOBAL, args)
        assert code == HipErrorCode.hipErrorNotFound
        code = await _refused(client, Opcode.MODULE_GET_GLOBAL, {"module": 999, "name": "x"})
        assert code == HipErrorCode.hipErrorInvalidHandle
        code = await _refused(client, Opcode.MODULE_GET_GLOBAL, {"module": module})
        assert code == HipErrorCode.hipErrorInvalidValue
        assert await client.call(Opcode.DEVICE_COUNT, {}) == {"count": 1}


async def test_a_global_is_reachable_until_its_module_goes(anyio_backend: str) -> None:
    backend = GlobalsBackend()
    async with raw_client_to(backend) as client:
        module = (await client.call(Opcode.MODULE_BUILTIN, {"name": "fill_f32"}))["module"]
        got = await client.call(Opcode.MODULE_GET_GLOBAL, {"module": module, "name": "flag"})
        ptr, size = got["ptr"], got["size"]
        assert size == 64 and ptr == backend.globals[next(iter(backend.globals))]
        again = await client.call(Opcode.MODULE_GET_GLOBAL, {"module": module, "name": "flag"})
        assert again == got
        code = await _refused(client, Opcode.MODULE_GET_GLOBAL, {"module": module, "name": "other"})
        assert code == HipErrorCode.hipErrorNotFound

        data = bytes(range(16))
        await client.call(Opcode.MEMCPY_HTOD, {"dst": ptr + 8, "size": 16}, data)
        back = bytearray(16)
        backend.memcpy_dtoh(memoryview(back), ptr + 8)
        assert bytes(back) == data
        # Past its end, and FREE of it, are refused; the variable is the module's.
        code = await _refused(client, Opcode.MEMCPY_HTOD, {"dst": ptr + 60, "size": 8}, data[:8])
        assert code == HipErrorCode.hipErrorInvalidValue
        assert (
            await _refused(client, Opcode.FREE, {"ptr": ptr}) == HipErrorCode.hipErrorInvalidValue
        )

        await client.call(Opcode.MODULE_UNLOAD, {"module": module})
        code = await _refused(client, Opcode.MEMCPY_HTOD, {"dst": ptr, "size": 4}, data[:4])
        assert code == HipErrorCode.hipErrorInvalidValue


class LimitsBackend(EmulatorBackend):
    """The emulator with one device limit: CU_LIMIT_STACK_SIZE (0), 1024 bytes."""

    def device_limit(self, limit: int) -> int:
        if limit != 0:
            raise HipError(HipErrorCode.hipErrorUnsupportedLimit, f"no limit {limit}")
        return 1024


async def test_device_limits_are_read_from_the_backend(anyio_backend: str) -> None:
    for backend, expected in ((EmulatorBackend(), None), (LimitsBackend(), 1024)):
        async with raw_client_to(backend) as client:
            if expected is None:
                code = await _refused(client, Opcode.DEVICE_LIMIT, {"limit": 0})
                assert code == HipErrorCode.hipErrorNotSupported
            else:
                got = await client.call(Opcode.DEVICE_LIMIT, {"limit": 0})
                assert got == {"value": expected}
                code = await _refused(client, Opcode.DEVICE_LIMIT, {"limit": 5})
                assert code == HipErrorCode.hipErrorUnsupportedLimit
            code = await _refused(client, Opcode.DEVICE_LIMIT, {"limit": 1000})
            assert code == HipErrorCode.hipErrorInvalidValue
            assert await client.call(Opcode.DEVICE_COUNT, {}) == {"count": 1}
