"""FUNCTION_ATTRIBUTE (0x0509) and FUNCTION_OCCUPANCY (0x050A): a kernel's attribute read or
set, and its occupancy, on the worker, which the
CUDA proxy's cuFuncGetAttribute / cuFuncSetAttribute ask for. The emulator cannot tell
(hipErrorNotSupported); bad handles and values are refused; a cuda worker answers from its
driver (checked on the GPU host by scripts/cuda-gpu-check)."""

from __future__ import annotations

import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipError, HipErrorCode
from hipr.protocol.opcodes import Opcode
from hipr.testing.harness import raw_client_to

pytestmark = pytest.mark.anyio


async def test_function_attribute_on_the_emulator(anyio_backend: str) -> None:
    async with raw_client_to(EmulatorBackend()) as client:
        fill = await client.call(Opcode.MODULE_BUILTIN, {"name": "fill_f32"})
        function = fill["function"]
        with pytest.raises(HipError) as info:
            await client.call(Opcode.FUNCTION_ATTRIBUTE, {"function": function, "attribute": 0})
        assert info.value.code == HipErrorCode.hipErrorNotSupported
        with pytest.raises(HipError) as info:
            await client.call(Opcode.FUNCTION_ATTRIBUTE, {"function": 9999, "attribute": 0})
        assert info.value.code == HipErrorCode.hipErrorInvalidHandle
        with pytest.raises(HipError) as info:
            await client.call(Opcode.FUNCTION_ATTRIBUTE, {"function": function, "attribute": 1000})
        assert info.value.code == HipErrorCode.hipErrorInvalidValue
        for query in ("max_active_blocks", "max_active_clusters"):
            with pytest.raises(HipError) as info:
                await client.call(
                    Opcode.FUNCTION_OCCUPANCY,
                    {"function": function, "query": query, "block_size": 128},
                )
            assert info.value.code == HipErrorCode.hipErrorNotSupported
        with pytest.raises(HipError) as info:
            await client.call(
                Opcode.FUNCTION_OCCUPANCY, {"function": function, "query": "best_guess"}
            )
        assert info.value.code == HipErrorCode.hipErrorInvalidValue
        # The worker keeps serving the session after each refusal.
        assert await client.call(Opcode.DEVICE_COUNT, {}) == {"count": 1}
