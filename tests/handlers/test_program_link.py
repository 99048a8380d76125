"""PROGRAM_LINK (0x050C), PROGRAM_COMPILE's headers, and the built-in module's variable:
what the proxy's libhiprtc.so (hiprtcLink*, hiprtcCreateProgram's headers) and the hipcc
path's symbols (__hipRegisterVar, MODULE_GET_GLOBAL) ask of a worker."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipError, HipErrorCode
from hipr.protocol.opcodes import Opcode
from hipr.testing.harness import RawClient, raw_client_to

pytestmark = pytest.mark.anyio
E = HipErrorCode


class LinkingEmulator(EmulatorBackend):
    """The emulator with a stand-in linker and compiler that record what they were given:
    the worker's request checking and bulk slicing are what is under test."""

    def __init__(self) -> None:
        super().__init__()
        self.linked: list[tuple[int, bytes, str]] = []
        self.headers: list[tuple[str, str]] = []

    def program_link(self, inputs: Sequence[tuple[int, bytes, str]]) -> tuple[bytes, str]:
        self.linked = list(inputs)
        return b"|".join(code for _, code, _ in inputs), f"linked {len(inputs)}"

    def compile(
        self,
        source: str,
        name: str,
        options: Sequence[str],
        headers: Sequence[tuple[str, str]] = (),
    ) -> bytes:
        self.headers = list(headers)
        return source.encode()


async def _refused(client: RawClient, opcode: int, args: Any, bulk: bytes = b"") -> HipError:
    with pytest.raises(HipError) as info:
        await client.call(opcode, args, bulk)
    return info.value


async def _reply(client: RawClient, opcode: int, args: Any, bulk: bytes = b"") -> tuple[Any, bytes]:
    frame = await client.reply(await client.send(opcode, args, bulk))
    if frame.args and "code" in frame.args and "message" in frame.args:
        raise HipError.from_wire(frame.args)
    return frame.args, bytes(frame.bulk)


async def test_the_emulator_refuses_to_link_and_keeps_serving(anyio_backend: str) -> None:
    async with raw_client_to(EmulatorBackend()) as client:
        error = await _refused(
            client, Opcode.PROGRAM_LINK, {"kinds": [1, 1], "sizes": [3, 2]}, b"abcde"
        )
        assert error.code == E.hipErrorNotSupported and "no device linker" in error.message
        assert await client.call(Opcode.DEVICE_COUNT, {}) == {"count": 1}


async def test_link_inputs_are_checked_and_sliced(anyio_backend: str) -> None:
    backend = LinkingEmulator()
    async with raw_client_to(backend) as client:
        args = {"kinds": [1, 100], "sizes": [3, 2], "names": ["a.ptx", "b.bc"]}
        reply, image = await _reply(client, Opcode.PROGRAM_LINK, args, b"abcde")
        assert reply == {"size": 6, "log": "linked 2"} and image == b"abc|de"
        assert backend.linked == [(1, b"abc", "a.ptx"), (100, b"de", "b.bc")]
        await _reply(client, Opcode.PROGRAM_LINK, {"kinds": [0], "sizes": [1]}, b"x")
        assert backend.linked == [(0, b"x", "input0")]
        bad = [
            ({"kinds": [], "sizes": []}, b""),
            ({"kinds": [1], "sizes": [4]}, b"abc"),  # the bulk is shorter
            ({"kinds": [1], "sizes": [2]}, b"abc"),  # and longer
            ({"kinds": [1, 1], "sizes": [3]}, b"abc"),
            ({"kinds": [7], "sizes": [3]}, b"abc"),  # no such input kind
            ({"kinds": [1, 1], "sizes": [3, 0]}, b"abc"),
            ({"kinds": [1], "sizes": [3], "names": ["a", "b"]}, b"abc"),
            ({"kinds": [1], "sizes": [3], "names": [7]}, b"abc"),
            ({"kinds": "ptx", "sizes": [3]}, b"abc"),
        ]
        for args, bulk in bad:
            error = await _refused(client, Opcode.PROGRAM_LINK, args, bulk)
            assert error.code == E.hipErrorInvalidValue, args
            assert "PROGRAM_LINK" in error.message
        assert await client.call(Opcode.DEVICE_COUNT, {}) == {"count": 1}


async def test_a_programs_headers_reach_the_compiler(anyio_backend: str) -> None:
    backend = LinkingEmulator()
    async with raw_client_to(backend) as client:
        args = {
            "source": '#include "k.h"\n',
            "headers": ["#define N 4\n", "int x;"],
            "include_names": ["k.h", "sub/x.h"],
        }
        reply, image = await _reply(client, Opcode.PROGRAM_COMPILE, args)
        assert image == b'#include "k.h"\n' and reply["size"] == len(image)
        assert backend.headers == [("k.h", "#define N 4\n"), ("sub/x.h", "int x;")]
        for bad in (
            {"source": "", "headers": ["a"], "include_names": []},
            {"source": "", "headers": ["a"], "include_names": [""]},
            {"source": "", "headers": "a", "include_names": ["a"]},
        ):
            error = await _refused(client, Opcode.PROGRAM_COMPILE, bad)
            assert error.code == E.hipErrorInvalidValue


async def test_the_builtin_modules_variable_is_read_by_its_kernel(anyio_backend: str) -> None:
    async with raw_client_to(EmulatorBackend()) as client:
        got = await client.call(Opcode.MODULE_BUILTIN, {"name": "add_bias_f32"})
        var = await client.call(
            Opcode.MODULE_GET_GLOBAL, {"module": got["module"], "name": "hipr_builtin_bias"}
        )
        assert var["size"] == 4 and var["ptr"]
        x = (await client.call(Opcode.MALLOC, {"size": 16}))["ptr"]
        ones = np.ones(4, np.float32).tobytes()
        await client.call(Opcode.MEMCPY_HTOD, {"dst": x, "size": 16}, ones)
        bias = np.float32(0.25).tobytes()
        await client.call(Opcode.MEMCPY_HTOD, {"dst": var["ptr"], "size": 4}, bias)
        launch = {
            "function": got["function"],
            "grid": [1],
            "block": [4],
            "args": struct.pack("<QQ", x, 4),
            "ptrs": [0],
        }
        await client.call(Opcode.LAUNCH_KERNEL, launch)
        _, out = await _reply(client, Opcode.MEMCPY_DTOH, {"src": x, "size": 16})
        assert np.frombuffer(out, np.float32).tolist() == [1.25] * 4
        # The variable is the module's: FREE refuses it, and so does a copy past it.
        error = await _refused(client, Opcode.FREE, {"ptr": var["ptr"]})
        assert error.code == E.hipErrorInvalidValue
        error = await _refused(client, Opcode.MEMCPY_HTOD, {"dst": var["ptr"], "size": 8}, bytes(8))
        assert error.code == E.hipErrorInvalidValue
        error = await _refused(
            client, Opcode.MODULE_GET_GLOBAL, {"module": got["module"], "name": "nope"}
        )
        assert error.code == E.hipErrorNotFound and "hipr_builtin_bias" in error.message
