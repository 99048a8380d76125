"""A kernel launch and the poll for its end as one native call (``native/launch_wait.c``).

The worker's busiest request from an unmodified program is one small kernel, then a
synchronize: PyTorch's ``x.add_(1); torch.cuda.synchronize()`` is one LAUNCH_KERNEL with
``synchronize``. Through the binding, the launch and a Python loop of stream queries took
two to three times what the same calls take from C, and the interpreter's turns between
the launch's return and the first query that sees the kernel done were most of that
(``benchmarks/proxy/stages.py``). :class:`LaunchWait` makes the launch, the polling and
the reply's send one call through ctypes.

The library is built from its source beside the package at install (``setup.py``), or
else compiled on first use into the user's cache when a C compiler is present; without
either, :func:`load_launch_wait` returns None and the worker keeps the Python path,
which gives the same answers.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DONE",
    "LAUNCH_FAILED",
    "LAUNCH_PROTOTYPE",
    "MAX_REPLY_BYTES",
    "MAX_WAIT_STREAMS",
    "QUERY_FAILED",
    "QUERY_PROTOTYPE",
    "RUNNING",
    "LaunchMany",
    "LaunchWait",
    "LaunchWaitResults",
    "PreparedLaunchWait",
    "entry_address",
    "load_launch_wait",
]

SOURCE = Path(__file__).resolve().parent / "native" / "launch_wait.c"
HEADER = SOURCE.with_suffix(".h")
LIBRARY = "libhipr_launch_wait.so"
#: Where an installed package keeps the library that setup.py built.
PACKAGED = Path(__file__).resolve().parent / "lib" / LIBRARY

#: The call structure's version (``HIPR_LAUNCH_WAIT_ABI``).
ABI = 4
#: The streams one call may poll besides the launch's (``MAX_WAIT_STREAMS`` in the C source).
MAX_WAIT_STREAMS = 64
#: The call's outcomes (``HIPR_LW_*`` in the C source).
DONE, RUNNING, LAUNCH_FAILED, QUERY_FAILED, BAD_CALL = range(5)

#: The C shape of the runtime's launch (``cuLaunchKernel``, ``hipModuleLaunchKernel``), for
#: a simulated runtime that hands its own entry points to :func:`load_launch_wait`.
LAUNCH_PROTOTYPE = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    *(ctypes.c_uint,) * 7,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
)
#: The C shape of the runtime's stream query (``cuStreamQuery``, ``hipStreamQuery``).
QUERY_PROTOTYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


#: Bytes of a reply the call can send itself (``MAX_REPLY_BYTES``).
MAX_REPLY_BYTES = 64
# The call structure's layout (``struct hipr_launch_wait``; launch_wait.c asserts these
# offsets): the fixed inputs as one packed store, the outputs as one read.
_ENTRIES = struct.Struct("<QQ")
_INPUTS = struct.Struct("<Q6IIIQqiiIIQ")
_INPUTS_AT = 16
_OUTPUTS = struct.Struct("<iiqq")
_OUTPUTS_AT = 96
_REPLY_AT = 120
_STREAMS_AT = 184
_SIZE = _STREAMS_AT + 8 * MAX_WAIT_STREAMS
_STREAM_WORDS = [struct.Struct(f"<{n}Q") for n in range(MAX_WAIT_STREAMS + 1)]


class _CallStructure:
    """One ``struct hipr_launch_wait`` and the call into the library on it: what
    :class:`LaunchWait` and :class:`PreparedLaunchWait` share."""

    __slots__ = ("_address", "_buffer", "_fn", "_not_ready", "_view")

    def __init__(self, fn: Any, entries: tuple[int, int], not_ready: int) -> None:
        self._fn = fn
        self._buffer = ctypes.create_string_buffer(_SIZE)
        self._view = memoryview(self._buffer).cast("B")
        _ENTRIES.pack_into(self._view, 0, *entries)
        self._not_ready = not_ready
        self._address = ctypes.addressof(self._buffer)

    def _pack(
        self,
        function: int,
        dims: tuple[int, ...],
        shared_mem: int,
        stream: int,
        others: Sequence[int],
        extra: int,
        spin_seconds: float,
        reply: tuple[int, bytes] | None,
    ) -> None:
        """Every input of a call (see :meth:`LaunchWait.run`)."""
        view = self._view
        count = len(others)
        if count > MAX_WAIT_STREAMS:
            raise ValueError(f"at most {MAX_WAIT_STREAMS} other streams, not {count}")
        if reply is None:
            fd, size = -1, 0
        else:
            fd, data = reply
            size = len(data)
            if size > MAX_REPLY_BYTES:
                raise ValueError(f"a reply of at most {MAX_REPLY_BYTES} bytes, not {size}")
            view[_REPLY_AT : _REPLY_AT + size] = data
        _INPUTS.pack_into(
            view, _INPUTS_AT, function, *dims, shared_mem, count, extra,
            int(spin_seconds * 1e9), self._not_ready, fd, size, 0, stream,
        )  # fmt: skip
        if count:
            _STREAM_WORDS[count].pack_into(view, _STREAMS_AT, *others)

    def _call(self) -> int:
        status: int = self._fn(self._address)
        if status == BAD_CALL:
            raise ValueError("hipr_launch_wait refused its call structure")
        return status

    def reply_sent(self) -> int:
        """Bytes of the last call's reply the socket took (0: none sent; negative: the
        send's ``-errno``)."""
        return int(_OUTPUTS.unpack_from(self._view, _OUTPUTS_AT)[3])

    def results(self) -> LaunchWaitResults:
        """What the last call found beside its outcome."""
        launch, query, polled_ns, sent = _OUTPUTS.unpack_from(self._view, _OUTPUTS_AT)
        return LaunchWaitResults(launch, query, polled_ns, sent)


class LaunchWait(_CallStructure):
    """One thread's launch-and-wait calls into the native library: the runtime's launch
    and stream-query entry points (C function addresses) and its "not ready" result
    are fixed at construction; the call structure is reused, so a call costs one packed
    store (two with other streams to poll) and one foreign call. Not for use from two
    threads at once (the worker's event loop owns the one it makes)."""

    __slots__ = ("_entries", "many")

    def __init__(self, library: ctypes.CDLL, launch: int, query: int, not_ready: int) -> None:
        fn = library.hipr_launch_wait
        fn.argtypes = [ctypes.c_void_p]
        fn.restype = ctypes.c_int
        self._entries = (launch, query)
        super().__init__(fn, self._entries, not_ready)
        #: The same library's run of launches (:class:`LaunchMany`).
        self.many = LaunchMany(library, launch)

    def run(
        self,
        function: int,
        dims: tuple[int, ...],
        shared_mem: int,
        stream: int,
        others: Sequence[int],
        extra: int,
        spin_seconds: float,
        reply: tuple[int, bytes] | None = None,
    ) -> int:
        """Launch ``function`` (grid and block in ``dims``) on ``stream`` with the filled
        ``extra`` array, then poll ``stream`` and ``others`` (at most
        :data:`MAX_WAIT_STREAMS`) until all are idle, a query fails, or ``spin_seconds``
        pass; with ``reply`` (a socket descriptor and at most :data:`MAX_REPLY_BYTES`
        bytes), send those bytes once all are idle. The outcome (:data:`DONE`,
        :data:`RUNNING`, :data:`LAUNCH_FAILED`, :data:`QUERY_FAILED`); :meth:`results`
        tells the rest."""
        self._pack(function, dims, shared_mem, stream, others, extra, spin_seconds, reply)
        return self._call()


#: ``struct hipr_launch_many``'s layout (launch_wait.c asserts its offsets).
_MANY = struct.Struct("<QQ6IIIQQQQQQQ")


class LaunchMany:
    """A run of launches of one kernel in one configuration on one stream, each with
    argument bytes of its own (a LAUNCH_KERNELS batch), as one native call
    (``hipr_launch_many``): each launch costs the runtime's own launch, not a binding's
    call. The call releases the interpreter lock (it runs on a session's GPU thread,
    while the loop reads the next batch), and each call has its own structure, so any
    thread may make one."""

    __slots__ = ("_fn", "_launch")

    def __init__(self, library: ctypes.CDLL, launch: int) -> None:
        # The same library opened again as a CDLL: its calls release the lock.
        fn = ctypes.CDLL(library._name).hipr_launch_many
        fn.argtypes = [ctypes.c_void_p]
        fn.restype = ctypes.c_int
        self._fn = fn
        self._launch = launch

    def run(
        self,
        function: int,
        dims: tuple[int, ...],
        shared_mem: int,
        stream: int,
        blobs: Sequence[bytes],
        extra_keys: tuple[int, int, int],
    ) -> array[int]:
        """Launch ``function`` once per argument buffer in ``blobs``, in order, with the
        runtime's ``extra`` markers ``extra_keys`` (BUFFER_POINTER, BUFFER_SIZE, END):
        each launch's result (0 or the runtime's error), one refused stopping none of
        the others."""
        count = len(blobs)
        data = b"".join(blobs)
        sizes = array("I", [len(blob) for blob in blobs])
        results = array("i", bytes(4 * count))
        call = ctypes.create_string_buffer(_MANY.size)
        # The bytes object's own storage: alive, and unchanged, through the call.
        data_address = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0
        _MANY.pack_into(
            call, 0, self._launch, function, *dims, shared_mem, count, stream, data_address,
            sizes.buffer_info()[0], results.buffer_info()[0], *extra_keys,
        )  # fmt: skip
        if self._fn(call) < 0:
            raise ValueError("hipr_launch_many refused its call structure")
        return results


#: The reply's socket, and the request id inside the reply (the wire header's
#: little-endian 32 bits), as the prepared call patches them.
_FD = struct.Struct("<i")
_FD_AT = 76
_REQUEST_ID = struct.Struct("<I")


class PreparedLaunchWait(_CallStructure):
    """One launch-and-wait packed once and made again unchanged (the express path's
    loop over one kernel, ``hipr.worker.express``): :meth:`LaunchWait.run`'s call with
    ``reply`` (its request id at byte ``request_id_at``) packed in a call structure of
    its own, so calls of :class:`LaunchWait` meanwhile (other sessions on the same loop)
    leave it as it was. A call costs two small stores (the reply's socket and its
    request id) and the foreign call. ``extra`` must stay valid and unchanged for its
    life (a buffer of its own, not the thread's reused one)."""

    __slots__ = ("_request_id_at",)

    def __init__(
        self,
        native: LaunchWait,
        function: int,
        dims: tuple[int, ...],
        shared_mem: int,
        stream: int,
        others: Sequence[int],
        extra: int,
        spin_seconds: float,
        reply: bytes,
        request_id_at: int,
    ) -> None:
        super().__init__(native._fn, native._entries, native._not_ready)
        if not 0 <= request_id_at <= len(reply) - _REQUEST_ID.size:
            raise ValueError(f"a request id at {request_id_at} is outside the reply")
        self._pack(function, dims, shared_mem, stream, others, extra, spin_seconds, (-1, reply))
        self._request_id_at = _REPLY_AT + request_id_at

    def again(self, fd: int, request_id: int) -> int:
        """The call, its reply (request ``request_id``'s) sent to ``fd`` once done (-1:
        not sent); the outcome, as :meth:`LaunchWait.run`'s."""
        view = self._view
        _FD.pack_into(view, _FD_AT, fd)
        _REQUEST_ID.pack_into(view, self._request_id_at, request_id)
        return self._call()


@dataclass(frozen=True, slots=True)
class LaunchWaitResults:
    """The runtime's result of the launch and of the last query, the nanoseconds from
    the launch's return to the answer, and the bytes of the reply the socket took (0:
    none sent; negative: the send's ``-errno``)."""

    launch_result: int
    query_result: int
    polled_ns: int
    reply_sent: int


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hipr" / "native"


def _compiled_into_cache() -> Path | None:
    """The library compiled from :data:`SOURCE` into the user's cache (once per source
    version), or None without a C compiler or a writable cache."""
    digest = hashlib.sha256(SOURCE.read_bytes() + HEADER.read_bytes()).hexdigest()[:16]
    target = _cache_dir() / f"libhipr_launch_wait-{digest}.so"
    if target.exists():
        return target
    return target if build_library(target) else None


def build_library(target: Path) -> bool:
    """Compile :data:`SOURCE` into ``target`` (replaced atomically, so a worker starting
    beside this one sees it whole or not at all); False without a C compiler, or when
    the compiler or the file system refused. setup.py calls it by path at install."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / LIBRARY
            result = subprocess.run(
                [cc, *COMPILE_FLAGS, "-o", str(built), str(SOURCE)],
                capture_output=True,
                check=False,
                timeout=60,
            )
            if result.returncode != 0:
                return False
            os.replace(built, target)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


#: How the library is compiled.
COMPILE_FLAGS = ("-std=c11", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror")


def load_launch_wait(launch: int | None, query: int | None, not_ready: int) -> LaunchWait | None:
    """A :class:`LaunchWait` over the runtime's ``launch`` and ``query`` entry points
    (C function addresses), or None when either is unknown or the library is neither
    packaged nor compilable here (``HIPR_NATIVE_LAUNCH=0`` also says None: the Python
    path, for comparisons)."""
    if not launch or not query or os.environ.get("HIPR_NATIVE_LAUNCH") == "0":
        return None
    library = _opened(PACKAGED) if PACKAGED.exists() else None
    if library is None:  # none packaged, or built from other sources
        cached = _compiled_into_cache()
        library = None if cached is None else _opened(cached)
    if library is None:
        return None
    return LaunchWait(library, launch, query, not_ready)


def _opened(path: Path) -> ctypes.CDLL | None:
    """The library at ``path`` when it loads and was built for this module's layout.

    Loaded as a ``PyDLL``: the call keeps the interpreter lock. Releasing it cost the
    tiny op ~7 µs a call on the H200 host (77.1 against 69.9 µs, medians of six
    alternating rounds, ``docs/gpu-runs/2026-11-26-native-launch.txt``): the lock
    was taken by another thread meanwhile and waited for on return. The call is bounded
    by its poll's length (the 30 µs the Python poll held the lock for before it)."""
    try:
        library = ctypes.PyDLL(str(path))
        abi = library.hipr_launch_wait_abi
    except (OSError, AttributeError):
        return None
    abi.restype = ctypes.c_int
    return library if abi() == ABI else None


def entry_address(function: Any) -> int:
    """The C address of a ctypes function (a library's symbol or a CFUNCTYPE object)."""
    return int(ctypes.cast(function, ctypes.c_void_p).value or 0)
