"""The handler registry refuses wiring mistakes at import."""

from __future__ import annotations

import types
from typing import Any

import pytest

from hipr.handlers import REGISTRY
from hipr.handlers.registry import HandlerRegistry, RegistrationError, answers_now, handler
from hipr.protocol.opcodes import Opcode, OpcodeRange


def make_module(name: str, opcode_range: OpcodeRange | None) -> types.ModuleType:
    import sys

    module = types.ModuleType(name)
    if opcode_range is not None:
        module.OPCODE_RANGE = opcode_range  # type: ignore[attr-defined]
    sys.modules[name] = module
    return module


def define(module: types.ModuleType, opcode: Opcode, registry: HandlerRegistry) -> None:
    async def fn(session: Any, request: Any) -> Any:
        return {}

    fn.__module__ = module.__name__
    handler(opcode, registry=registry)(fn)


def test_every_opcode_has_a_handler_in_its_own_module() -> None:
    registered = {spec.opcode for spec in REGISTRY.specs()}
    for opcode in Opcode:
        if opcode in (Opcode.DATA, Opcode.ADMIN_STATUS):
            continue
        assert opcode in registered, opcode
    for spec in REGISTRY.specs():
        module = __import__(spec.module, fromlist=["OPCODE_RANGE"])
        assert spec.opcode.range is module.OPCODE_RANGE
        assert spec.doc, f"{spec.opcode.name} has no docstring"


def test_duplicate_opcode_fails_with_both_names() -> None:
    registry = HandlerRegistry()
    module = make_module("fake_memory_handlers", OpcodeRange.MEMORY)
    define(module, Opcode.MALLOC, registry)
    with pytest.raises(RegistrationError, match="MALLOC.*already handled by fake_memory_handlers"):
        define(module, Opcode.MALLOC, registry)


def test_opcode_outside_module_range_fails() -> None:
    registry = HandlerRegistry()
    module = make_module("fake_stream_handlers", OpcodeRange.STREAM)
    with pytest.raises(RegistrationError, match="MALLOC.*owns the STREAM range"):
        define(module, Opcode.MALLOC, registry)


def test_module_without_range_fails() -> None:
    registry = HandlerRegistry()
    module = make_module("fake_rangeless_handlers", None)
    with pytest.raises(RegistrationError, match="must define OPCODE_RANGE"):
        define(module, Opcode.MALLOC, registry)


def test_unknown_opcode_lookup_is_none() -> None:
    assert REGISTRY.get(0x7F7F) is None


def test_answers_now_needs_a_handler_and_is_registered_once() -> None:
    registry = HandlerRegistry()
    module = make_module("fake_device_handlers", OpcodeRange.DEVICE)

    def now(session: Any, request: Any) -> Any:
        return {}

    with pytest.raises(RegistrationError, match="DEVICE_SYNCHRONIZE now, which has no handler"):
        answers_now(Opcode.DEVICE_SYNCHRONIZE, registry=registry)(now)
    define(module, Opcode.DEVICE_SYNCHRONIZE, registry)
    answers_now(Opcode.DEVICE_SYNCHRONIZE, registry=registry)(now)
    spec = registry.get(Opcode.DEVICE_SYNCHRONIZE)
    assert spec is not None and spec.now is now
    with pytest.raises(RegistrationError, match="cannot answer DEVICE_SYNCHRONIZE now: it already"):
        answers_now(Opcode.DEVICE_SYNCHRONIZE, registry=registry)(now)


def test_the_worker_answers_now_only_calls_that_cannot_block() -> None:
    # A synchronous variant runs in the worker's I/O callback: only calls that answer
    # without waiting (or say LATER) may have one.
    answered_now = {spec.opcode for spec in REGISTRY.specs() if spec.now is not None}
    assert answered_now == {
        Opcode.DEVICE_SYNCHRONIZE,
        Opcode.STREAM_SYNCHRONIZE,
        Opcode.EVENT_SYNCHRONIZE,
        Opcode.LAUNCH_KERNEL,
        Opcode.LAUNCH_KERNELS,
        Opcode.MEMCPY_HTOD,
        Opcode.MEMCPY_HTOD_MANY,
        Opcode.MEMCPY_DTOH,  # a small one whose stream's work ends within a bounded poll
        Opcode.EVENT_RECORD,
        Opcode.STREAM_WAIT_EVENT,
        Opcode.GET_DEVICE,
        Opcode.DEVICE_PROPERTIES,
        Opcode.MEM_GET_INFO,
        Opcode.STREAM_QUERY,
        Opcode.EVENT_QUERY,
    }
