"""FUNCTION_PARAMS (0x0508): the worker reports a kernel's parameter layout, which the
native proxy packs ``kernelParams`` with."""

from __future__ import annotations

import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipError, HipErrorCode
from hipr.protocol.opcodes import Opcode
from hipr.testing.harness import raw_client_to

pytestmark = pytest.mark.anyio


async def test_layouts_of_builtin_kernels(anyio_backend: str) -> None:
    async with raw_client_to(EmulatorBackend()) as client:
        probe = await client.call(Opcode.MODULE_BUILTIN, {"name": "mixed_args_probe"})
        layout = await client.call(Opcode.FUNCTION_PARAMS, {"function": probe["function"]})
        # (ptr, i8, i32, f32, f64, i16, struct {i8; f64; i16}, u64) with C alignment.
        assert layout == {
            "offsets": [0, 8, 12, 16, 24, 32, 40, 64],
            "sizes": [8, 1, 4, 4, 8, 2, 24, 8],
            "pointers": [0],
        }
        axpy = await client.call(Opcode.MODULE_BUILTIN, {"name": "axpy_f32"})
        layout = await client.call(Opcode.FUNCTION_PARAMS, {"function": axpy["function"]})
        assert layout["pointers"] == [0, 1] and layout["offsets"] == [0, 8, 16, 24]
        with pytest.raises(HipError) as info:
            await client.call(Opcode.FUNCTION_PARAMS, {"function": 9999})
        assert info.value.code == HipErrorCode.hipErrorInvalidHandle
        with pytest.raises(HipError) as info:
            await client.call(Opcode.FUNCTION_PARAMS, {"function": "x"})
        assert info.value.code == HipErrorCode.hipErrorInvalidValue
