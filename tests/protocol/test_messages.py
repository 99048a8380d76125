"""The message declarations: one per opcode, well-formed, and their keys are their names."""

from __future__ import annotations

import pytest

from hipr.protocol import messages as m
from hipr.protocol.messages._schema import Message, field, message
from hipr.protocol.opcodes import Opcode


def test_every_opcode_is_declared_once_and_nothing_else_is() -> None:
    assert set(m.MESSAGES) == set(Opcode)
    for opcode, declaration in m.MESSAGES.items():
        assert declaration.opcode is opcode
        assert m.declared(opcode) is declaration
    assert m.declared(0x7F7F) is None


@pytest.mark.parametrize("declaration", list(m.MESSAGES.values()), ids=lambda d: d.__name__)
def test_a_declaration_is_complete(declaration: type[Message]) -> None:
    assert (declaration.__doc__ or "").strip(), f"{declaration.__name__} has no docstring"
    for f in (*declaration.fields, *declaration.reply):
        assert f.type in m.TYPES
        assert f.doc.strip(), f"{declaration.__name__}.{f.name} says nothing"
    # The class attribute of a request field is its key, a plain str.
    for f in declaration.fields:
        key = getattr(declaration, f.name)
        assert type(key) is str and key == f.name
    assert len(declaration.request_keys()) == len(declaration.fields)
    assert declaration.required_keys() <= declaration.request_keys()
    if declaration.batch_of:
        assert declaration.since_minor >= 1 and declaration.fire_and_forget
    if declaration.streams_request:
        assert declaration.request_bulk


def test_shared_field_groups_are_the_messages_own_keys() -> None:
    for launch in (m.LaunchKernel, m.LaunchKernels, m.GraphAddKernel):
        assert {f.name for f in m.LaunchConfig.fields} <= launch.request_keys()
    for compile_ in (m.ModuleCompile, m.ProgramCompile, m.CompileAndGetFunction):
        assert {f.name for f in m.Compile.fields} <= compile_.request_keys()
    assert m.LaunchKernel.request_keys() == {
        *(f.name for f in m.LaunchConfig.fields),
        "stream",
        "args",
        "synchronize",  # protocol 1.3
    }
    assert "synchronize" in m.LaunchKernels.request_keys()
    assert "synchronize" not in m.GraphAddKernel.request_keys()


def test_a_field_declared_twice_or_an_opcode_declared_twice_is_refused() -> None:
    with pytest.raises(TypeError, match="declared twice"):

        @message(Opcode.MALLOC)
        class Again(Message):
            """A second MALLOC."""

    with pytest.raises(TypeError, match="unknown wire type"):
        field("u64", "no such type")


def test_conformance_check_names_each_problem() -> None:
    good = {"dst": 1 << 40, "size": 4, "stream": None}
    assert m.MemcpyHtod.problems(good) == []
    problems = m.MemcpyHtod.problems({"dst": -1, "size": True, "stray": 1})
    assert any("'dst' is not address" in p for p in problems)
    assert any("'size' is not size" in p for p in problems)
    assert any("undeclared key 'stray'" in p for p in problems)
    assert m.Malloc.problems({}) == ["MALLOC: missing 'size'"]
    assert m.Malloc.problems({"ptr": 5}, reply=True) == []
    assert m.LaunchKernel.problems({"function": 1, "grid": 4, "block": [1, 2, 3]}) == []
    assert m.LaunchKernel.problems({"function": 1, "grid": [0], "block": [1]}) != []
    # A status map may carry more than it declares.
    assert m.AdminStatus.problems({"extra": 1}, reply=True) == []


def test_limits_the_handlers_enforce_are_the_declared_ones() -> None:
    from hipr.handlers import memory, module

    assert module.MAX_KERNEL_ARGS_BYTES == m.MAX_KERNEL_ARGS_BYTES
    assert module.MAX_BATCH_LAUNCHES == m.MAX_BATCH_LAUNCHES
    assert memory.MAX_PIECES == m.MAX_PIECES
    assert str(m.MAX_BATCH_LAUNCHES) in m.LaunchKernels.field_named("args").range
    with pytest.raises(KeyError, match="declares no request field 'nope'"):
        m.Malloc.field_named("nope")


def test_packed_kernel_arguments_use_the_launch_keys() -> None:
    # hipr.kernels sits below the protocol and cannot import the declarations: its
    # to_wire() (tests and tools use it) is held to them here.
    import numpy as np

    from hipr.kernels.kernel_args import pack_args

    wire = pack_args([np.uint32(1), np.float32(2.0)]).to_wire()
    assert set(wire) == {m.LaunchKernel.args, m.LaunchKernel.ptrs}
    assert m.LaunchKernel.problems({**wire, "function": 1, "grid": 1, "block": 1}) == []
