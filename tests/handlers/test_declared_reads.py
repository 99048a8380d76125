"""Handlers serve declared messages and read only declared fields, by their declared keys.

Statically: no handler reads an argument by a string literal; every key it names is a
declared field (``m.Malloc.size``), read with the reader of its wire type. At run time:
a session driven through the real client records every (opcode, key) the handlers read
and every reply they give, and each must be one the declaration of that opcode has.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hipr
import hipr.handlers  # registers every handler
from hipr.backends.emulator import EmulatorBackend
from hipr.handlers import args as args_module
from hipr.handlers.context import Reply
from hipr.handlers.registry import LATER, REGISTRY, HandlerRegistry, RegistrationError
from hipr.protocol import messages as m
from hipr.protocol.opcodes import Opcode, OpcodeRange
from hipr.testing.harness import worker_in_thread
from hipr.worker.config import WorkerConfig

HANDLERS = Path(hipr.handlers.__file__).parent
#: The Args reader methods and the wire types each may read.
READERS: dict[str, set[str]] = {
    "integer": {"uint", "int"},
    "size": {"size"},
    "address": {"address"},
    "handle": {"handle"},
    "number": {"float"},
    "text": {"text"},
    "blob": {"bytes"},
    "blob_list": {"[bytes]"},
    "str_list": {"[text]"},
    "int_list": {"[uint]"},
    "dim3": {"dim3"},
    "has": set(m.TYPES),
}


def test_every_registered_handler_serves_its_declaration_and_every_request_has_one() -> None:
    specs = {spec.opcode: spec for spec in REGISTRY.specs()}
    for opcode, spec in specs.items():
        declaration = m.MESSAGES[opcode]
        assert spec.message is declaration
        assert spec.fire_and_forget == declaration.fire_and_forget
        assert spec.streams_request == declaration.streams_request
    # DATA continues a request: the one opcode no handler serves.
    assert set(m.MESSAGES) - set(specs) == {Opcode.DATA}


def test_a_handler_for_an_undeclared_opcode_is_refused() -> None:
    registry = HandlerRegistry()

    async def fn(session: Any, request: Any) -> Any:
        return {}

    with pytest.raises(RegistrationError, match="does not declare"):
        registry.register(0x0299, fn, OpcodeRange.MEMORY)  # type: ignore[arg-type]

    class Stray(m.Message):
        """Declared nowhere."""

    Stray.opcode = Opcode.MALLOC
    with pytest.raises(RegistrationError, match="declares no opcode"):
        registry.register(Stray, fn, OpcodeRange.MEMORY)


def _key_constants(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Module-level ``NAME = m.Message.key`` constants: name -> (message, key)."""
    found = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and (ref := _declared_ref(node.value)) is not None
        ):
            found[node.targets[0].id] = ref
    return found


def _declared_ref(node: ast.expr) -> tuple[str, str] | None:
    """``m.Message.key`` -> ("Message", "key")."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "m"
    ):
        return node.value.attr, node.attr
    return None


def _reads(tree: ast.Module) -> Iterator[tuple[int, str, ast.expr]]:
    """Every ``<...>.args.<reader>(key, ...)`` or ``args.<reader>(key, ...)`` call."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver = node.func.value
        named_args = (isinstance(receiver, ast.Attribute) and receiver.attr == "args") or (
            isinstance(receiver, ast.Name) and receiver.id == "args"
        )
        if named_args and node.func.attr in READERS and node.args:
            yield node.lineno, node.func.attr, node.args[0]


@pytest.mark.parametrize("path", sorted(HANDLERS.glob("*.py")), ids=lambda p: p.name)
def test_handlers_read_arguments_by_declared_keys_with_their_types_reader(path: Path) -> None:
    tree = ast.parse(path.read_text())
    constants = _key_constants(tree)
    for node in ast.walk(tree):  # every m.X.y named anywhere is a declared field
        if (ref := _declared_ref(node)) is not None:  # type: ignore[arg-type]
            group = getattr(m, ref[0])
            assert ref[1] in {f.name for f in group.fields}, f"{path.name}: m.{ref[0]}.{ref[1]}"
    for line, reader, key in _reads(tree):
        where = f"{path.name}:{line}"
        assert not isinstance(key, ast.Constant), f"{where} reads {key.value!r} by a literal"
        ref = _declared_ref(key)
        if ref is None and isinstance(key, ast.Name):
            ref = constants.get(key.id)
            if ref is None:  # a helper's parameter, which its callers fill from m.X.y
                continue
        assert ref is not None, f"{where}: the key is not a declared field"
        group = getattr(m, ref[0])
        declared = next(f for f in group.fields if f.name == ref[1])
        assert declared.type in READERS[reader], (
            f"{where} reads {ref[0]}.{ref[1]} ({declared.type}) with .{reader}()"
        )


# --- at run time ---------------------------------------------------------------------


class Recorder:
    """The (opcode name, key) pairs read through Args, and replies that break their
    declarations."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: set[tuple[str, str]] = set()
        self.bad_replies: list[str] = []
        self.served: set[int] = set()
        #: Every request's decoded argument map, as the client built it.
        self.requests: list[tuple[Opcode, Any]] = []
        for name in READERS:
            original = getattr(args_module.Args, name)
            monkeypatch.setattr(args_module.Args, name, self._reading(original))
        for spec in REGISTRY.specs():
            now = spec.now and self._replying(spec.opcode, spec.now)
            wrapped = replace(spec, fn=self._replying_async(spec.opcode, spec.fn), now=now)
            monkeypatch.setitem(REGISTRY._handlers, spec.opcode, wrapped)

    def _reading(self, original: Any) -> Any:
        recorder = self

        def read(self: args_module.Args, key: str, *args: Any, **kwargs: Any) -> Any:
            recorder.reads.add((self._opcode, key))
            return original(self, key, *args, **kwargs)

        return read

    def _check(self, opcode: Opcode, result: Any) -> None:
        if result is LATER:
            return
        self.served.add(opcode)
        payload = result.result if isinstance(result, Reply) else result
        self.bad_replies += m.MESSAGES[opcode].problems(payload, reply=True)

    def _replying_async(self, opcode: Opcode, fn: Any) -> Any:
        async def serve(session: Any, request: Any) -> Any:
            self.requests.append((opcode, request.args._map))
            result = await fn(session, request)
            self._check(opcode, result)
            return result

        return serve

    def _replying(self, opcode: Opcode, fn: Any) -> Any:
        def serve(session: Any, request: Any) -> Any:
            self.requests.append((opcode, request.args._map))
            result = fn(session, request)
            self._check(opcode, result)
            return result

        return serve


def _session(gpu: Any) -> None:
    """Most calls of the API, so that most handlers run."""
    gpu.set_device(0)
    gpu.device_properties(0)
    gpu.mem_get_info()
    x = gpu.malloc(4096)
    y = gpu.malloc(4096)
    data = np.arange(1024, dtype=np.float32)
    gpu.memcpy_htod(x, data)
    for i in range(4):  # small fire-and-forget copies: a MEMCPY_HTOD_MANY
        gpu.memcpy_htod_async(x + 4 * i, np.float32(i).tobytes())
    gpu.memset(y, 0, 4096)
    gpu.memcpy_dtod(y, x, 4096)
    out = np.empty(1024, dtype=np.float32)
    gpu.memcpy_dtoh(y, out=out)
    gpu.malloc_htod(data)
    stream = gpu.stream_create()
    event, end = gpu.event_create(), gpu.event_create()
    fill = gpu.builtin("fill_f32")
    for _ in range(3):  # fire-and-forget launches of one configuration: a LAUNCH_KERNELS
        fill.launch(1, 64, [x, np.float32(1.0), np.uint64(1024)], stream=stream)
    stream.synchronize()
    fill.launch(1, 64, [x, np.float32(1.0), np.uint64(1024)], stream=stream)  # alone
    event.record(stream)
    stream.wait_event(event)
    end.record(stream)
    stream.synchronize()
    stream.query()
    event.synchronize()
    event.query()
    gpu.get_device()
    gpu.device_count()
    gpu.ping()
    stream.begin_capture()
    gpu.memset(y, 2, 64, stream=stream)
    stream.end_capture().destroy()
    event.elapsed_ms(end)
    graph = gpu.graph_create()
    a = graph.add_memset(y, 1, 64)
    b = graph.add_memcpy(x, y, 64, dependencies=[a])
    graph.add_kernel(fill, 1, 64, [x, np.float32(2.0), np.uint64(16)], dependencies=[b])
    runnable = graph.instantiate()
    runnable.launch(stream)
    gpu.synchronize()
    runnable.destroy()
    graph.destroy()
    stream.destroy()
    event.destroy()
    end.destroy()
    gpu.free(x)
    gpu.free(y)
    gpu.synchronize()


def test_a_session_reads_only_declared_keys_and_replies_as_declared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = Recorder(monkeypatch)
    backend = EmulatorBackend(device_count=1, total_memory=64 << 20)
    with (
        worker_in_thread(WorkerConfig(), backend, loop="asyncio") as worker,
        hipr.connect(worker.bound_urls[0]) as gpu,
    ):
        _session(gpu)
    by_name = {op.name: m.MESSAGES[op] for op in Opcode}
    undeclared = [(op, key) for op, key in recorder.reads if key not in by_name[op].request_keys()]
    assert not undeclared, f"handlers read undeclared keys: {sorted(undeclared)}"
    assert not recorder.bad_replies, recorder.bad_replies
    # The scenario reached the calls it means to (the batch frames included).
    read_opcodes = {op for op, _ in recorder.reads}
    for name in ("LAUNCH_KERNELS", "MEMCPY_HTOD_MANY", "GRAPH_ADD_KERNEL", "EVENT_ELAPSED_TIME"):
        assert name in read_opcodes, name
    assert len(recorder.served) >= 25
    # Every request the client built is what its declaration accepts: no key it does not
    # declare, every required one, each of its declared type.
    wrong = [p for o, wire in recorder.requests for p in m.MESSAGES[o].problems(dict(wire))]
    assert not wrong, wrong
    # A launch carries exactly its declaration's keys: one spelling on both sides.
    launches = {o: dict(wire) for o, wire in recorder.requests}
    # (Less `synchronize`, protocol 1.3, which only the native proxy sends: its spelling
    # is checked against the worker by tests/proxy/test_core.py.)
    for launch in (Opcode.LAUNCH_KERNEL, Opcode.LAUNCH_KERNELS, Opcode.GRAPH_ADD_KERNEL):
        declared = m.MESSAGES[launch].request_keys() - {m.LaunchKernel.synchronize}
        assert set(launches[launch]) == declared, launch
