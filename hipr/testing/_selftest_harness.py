"""The GPU self-test's harness: what a backend offers (:data:`CAPABILITIES`), the sizes
the cases move, a hand packer of kernel arguments, the registry of cases and the state
they share. The cases are in :mod:`hipr.testing._selftest_cases`; the command is
:mod:`hipr.testing.gpu_selftest`."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hipr.errors import HipError, HipErrorCode
from hipr.kernels.builtins import BUILTINS

E = HipErrorCode
MiB = 1024 * 1024

#: What each backend offers beyond the Backend interface: NVRTC and CUDA's HIP prelude
#: (``nvidia``: the compile cases are written for them), capture of the per-thread
#: default stream (``default_stream_capture``), and HIP's leniency (``hip_leniency``:
#: ``malloc(0)`` returns a null pointer and a strided host source is copied, where the
#: emulator, strict on purpose, refuses both).
CAPABILITIES: dict[str, frozenset[str]] = {
    "cuda": frozenset({"nvidia", "default_stream_capture", "hip_leniency"}),
    "hip": frozenset({"default_stream_capture", "hip_leniency"}),
    "emulator": frozenset(),
}


@dataclass(frozen=True)
class Sizes:
    """How much the cases move: a GPU's (the default), or ``--small`` ones that a backend
    in host memory runs in seconds."""

    #: The copies staged and not (the threshold is 64 MiB).
    big: int = 64 * MiB
    #: Memory the staging case keeps its stream busy on, and how many fills it queues.
    busy: int = 256 * MiB
    busy_launches: int = 20
    #: Elements of the stream and event cases' kernels.
    stream_elements: int = 32 * MiB
    event_elements: int = 64 * MiB
    #: Element counts of the built-in kernels' comparison with numpy.
    builtin_elements: tuple[int, ...] = (1, 1000, 1_000_003)
    #: Elements each of the 8 threads fills.
    thread_elements: int = 200_000

    @classmethod
    def small(cls) -> Sizes:
        """Sizes for the emulator: every path still taken, at a fraction of the bytes."""
        return cls(
            big=2 * MiB,
            busy=4 * MiB,
            busy_launches=2,
            stream_elements=64 * 1024,
            event_elements=256 * 1024,
            builtin_elements=(1, 1000, 65_537),
            thread_elements=20_000,
        )


# --- argument packing (C alignment), done here by hand on purpose --------------------

#: kind -> (struct format, size, alignment)
_KINDS: dict[str, tuple[str, int, int]] = {
    "ptr": ("<Q", 8, 8),
    "u64": ("<Q", 8, 8),
    "i8": ("<b", 1, 1),
    "i16": ("<h", 2, 2),
    "i32": ("<i", 4, 4),
    "f32": ("<f", 4, 4),
    "f64": ("<d", 8, 8),
    # struct ProbeStruct { signed char a; double b; short c; }: a@0, b@8, c@16, size 24
    "probe_struct": ("<b7xdh6x", 24, 8),
}


def pack(kinds: Sequence[str], values: Sequence[Any]) -> bytes:
    """Pack kernel arguments as a C compiler lays out the parameter list: each at its
    alignment, the buffer ending with the last parameter (no sizeof-style tail)."""
    out = bytearray()
    for kind, value in zip(kinds, values, strict=True):
        fmt, size, align = _KINDS[kind]
        out += b"\0" * (-len(out) % align)
        chunk = struct.pack(fmt, *value) if isinstance(value, tuple) else struct.pack(fmt, value)
        assert len(chunk) == size, (kind, len(chunk))
        out += chunk
    return bytes(out)


def check_pack_layout() -> None:
    """The hand packer lays out mixed_args_probe's parameters as a C compiler does."""
    kinds = BUILTINS["mixed_args_probe"].arg_kinds
    buf = pack(kinds, [0x1111, -1, 2, 3.0, 4.0, 5, (6, 7.0, 8), 9])
    # ptr@0 i8@8 i32@12 f32@16 f64@24 i16@32 struct@40 (a@40 b@48 c@56) u64@64, size 72
    assert len(buf) == 72, len(buf)
    assert struct.unpack_from("<b", buf, 8)[0] == -1
    assert struct.unpack_from("<i", buf, 12)[0] == 2
    assert struct.unpack_from("<f", buf, 16)[0] == 3.0
    assert struct.unpack_from("<d", buf, 24)[0] == 4.0
    assert struct.unpack_from("<h", buf, 32)[0] == 5
    assert struct.unpack_from("<b", buf, 40)[0] == 6
    assert struct.unpack_from("<d", buf, 48)[0] == 7.0
    assert struct.unpack_from("<h", buf, 56)[0] == 8
    assert struct.unpack_from("<Q", buf, 64)[0] == 9


# --- harness ---------------------------------------------------------------------------

Case = Callable[["Ctx"], None]


@dataclass(frozen=True)
class CaseSpec:
    """One case: its title, what it needs of the backend (see :data:`CAPABILITIES`)
    and the check itself."""

    name: str
    needs: frozenset[str]
    run: Case


CASES: list[CaseSpec] = []


def case(name: str, needs: frozenset[str] = frozenset()) -> Callable[[Case], Case]:
    """Register a case, in running order."""

    def register(fn: Case) -> Case:
        CASES.append(CaseSpec(name, needs, fn))
        return fn

    return register


def expect_error(code: int | tuple[int, ...], fn: Callable[[], object]) -> HipError:
    """The HipError ``fn()`` raises, which must carry ``code`` (or one of them)."""
    codes = code if isinstance(code, tuple) else (code,)
    names = " or ".join(E(c).name for c in codes)
    try:
        fn()
    except HipError as exc:
        assert exc.code in codes, f"expected {names}, got {exc!r}"
        return exc
    raise AssertionError(f"expected {names}, nothing raised")


class Ctx:
    """State shared by the cases: the backend, its name, the sizes and the built-in
    kernels."""

    def __init__(self, backend: Any, name: str, device: int, sizes: Sizes) -> None:
        self.b = backend
        self.name = name
        self.device = device
        self.sizes = sizes
        self._fns: dict[str, Any] = {}

    def fn(self, name: str) -> Any:
        """The built-in kernel ``name`` (looked up once)."""
        if name not in self._fns:
            self._fns[name] = self.b.module_get_function(self.b.builtin_module(), name)
        return self._fns[name]

    def launch(
        self,
        name: str,
        values: Sequence[Any],
        n: int,
        stream: Any = None,
        block: int = 256,
        shared: int = 0,
    ) -> None:
        """Launch built-in ``name`` over ``n`` elements with ``values`` packed by hand."""
        grid = max(1, min((n + block - 1) // block, 4096))
        args = pack(BUILTINS[name].arg_kinds, values)
        self.b.launch(self.fn(name), (grid, 1, 1), (block, 1, 1), shared, stream, args)

    def upload(self, arr: np.ndarray, stream: Any = None) -> int:
        """A new allocation holding ``arr``."""
        ptr = int(self.b.malloc(arr.nbytes))
        self.b.memcpy_htod(ptr, arr.data.cast("B"), stream)
        return ptr

    def download(self, ptr: int, like: np.ndarray, stream: Any = None) -> np.ndarray:
        """An array like ``like`` read from ``ptr``."""
        out = np.empty_like(like)
        self.b.memcpy_dtoh(out.data.cast("B"), ptr, stream)
        return out

    def read_bytes(self, ptr: int, n: int) -> bytes:
        """``n`` bytes read from ``ptr``."""
        out = bytearray(n)
        self.b.memcpy_dtoh(memoryview(out), ptr)
        return bytes(out)
