"""What the GPU backend calls a GPU runtime through: the :class:`Runtime` protocol, the
plumbing every adapter shares (:class:`RuntimeBase`, :func:`import_bindings`) and small
helpers for reading a binding's answers. :mod:`~hipr.backends._runtime_cuda` and
:mod:`~hipr.backends._runtime_hip` are the two adapters."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from hipr.backends._callmap import DriverCalls, RtcCalls, RuntimeConstants
from hipr.backends._errmap import rtc_error
from hipr.backends._launch_wait import entry_address
from hipr.backends.interface import BackendUnavailable, DeviceProperties, Dim3
from hipr.errors import HipError, HipErrorCode

__all__ = ["Runtime", "RuntimeBase", "cstr", "import_bindings", "with_default_target"]

E = HipErrorCode

#: Success is 0 in CUresult, hipError_t, nvrtcResult and hiprtcResult alike.
SUCCESS = 0
#: CUDA_ERROR_INVALID_VALUE and hipErrorInvalidValue share the number.
INVALID_VALUE = 1


class Runtime(Protocol):
    """One GPU runtime as :class:`GpuBackend` drives it.

    Most of it is data: the function names (:attr:`calls`, :attr:`rtc_calls`) and flags
    (:meth:`constants`) from :mod:`hipr.backends._callmap`. The methods cover what the
    two runtimes do differently in shape. :class:`RuntimeBase` implements the calling
    and error plumbing; an adapter adds the rest.
    """

    #: The backend's name: ``"cuda"`` or ``"hip"``.
    name: str
    #: Names of the driver functions the shared logic calls.
    calls: DriverCalls[str]
    #: Names of the run-time compiler functions the shared logic calls.
    rtc_calls: RtcCalls[str]
    #: (size function, read function) pairs that read a compiled program back, tried in
    #: order: an empty or failed size moves on to the next, and the last one must work.
    rtc_images: tuple[tuple[str, str], ...]
    #: The function that says a kernel parameter's (offset, size), or None where the
    #: runtime has none (arguments then go to the launch exactly as packed).
    param_info_call: str | None
    #: The "not ready" result of stream and event queries.
    not_ready: int
    #: The driver function that issues many host-to-device copies in one call, or None
    #: where hipr cannot call one (:meth:`copy_batch`).
    batch_copy_call: str | None

    def open(self) -> int:
        """Initialise the runtime; the number of usable devices. Raises
        :class:`~hipr.backends.BackendUnavailable` when there is no usable one."""
        ...

    def constants(self) -> RuntimeConstants[Any]:
        """The flags and values the shared logic passes (after :meth:`open`)."""
        ...

    def call(self, fn: str, *args: Any) -> Any:
        """Call driver function ``fn``: its outputs, or its failure as HipError."""
        ...

    def raw(self, fn: str, *args: Any) -> Any:
        """Call driver function ``fn`` and return its result tuple unchecked."""
        ...

    def function(self, fn: str) -> Callable[..., Any]:
        """Driver function ``fn`` itself, for a caller that calls it many times (its
        result tuples unchecked, as :meth:`raw`'s)."""
        ...

    def provides(self, fn: str) -> bool:
        """True when the loaded binding has driver function ``fn``."""
        ...

    def native_entries(self) -> tuple[int, int] | None:
        """The C addresses of the kernel launch and the stream query, or None."""
        ...

    def error(self, code: int, call: str) -> HipError:
        """The HipError (with HIP's code) for result ``code`` of driver call ``call``."""
        ...

    def rtc_call(self, fn: str, *args: Any) -> Any:
        """Call compiler function ``fn``: its outputs, or its failure as HipError."""
        ...

    def rtc_raw(self, fn: str, *args: Any) -> Any:
        """Call compiler function ``fn`` and return its result tuple unchecked."""
        ...

    def bind(self, device: int) -> None:
        """Make ``device`` current on the calling thread."""
        ...

    def release(self) -> None:
        """Give back what :meth:`open` and :meth:`bind` took (at backend close)."""
        ...

    def read_properties(self, device: int) -> DeviceProperties:
        """Read ``device``'s properties from the runtime (the backend caches them)."""
        ...

    def compile_options(self, options: Sequence[str], arch: str) -> list[str]:
        """The compiler options for a compile for ``arch``: the user's, translated and
        completed for this runtime's compiler."""
        ...

    def program_headers(self) -> tuple[list[bytes], list[bytes]]:
        """(header contents, include names) every program is created with."""
        ...

    def output_buffer(self, size: int) -> bytes | bytearray:
        """A buffer of ``size`` bytes of the kind the compiler binding writes into."""
        ...

    def loadable_image(self, image: bytes) -> bytes:
        """``image`` as the module loader wants it."""
        ...

    def memset_node_args(self, device: int, ptr: int, value: int, size: int) -> tuple[Any, ...]:
        """The arguments after (graph, dependencies, count) of a 1-byte memset node."""
        ...

    def memcpy_node_args(self, device: int, dst: int, src: int, size: int) -> tuple[Any, ...]:
        """The arguments after (graph, dependencies, count) of a device-to-device copy
        node."""
        ...

    def kernel_node_params(
        self, function: Any, grid: Dim3, block: Dim3, shared_mem: int, extra: int
    ) -> Any:
        """The parameter block of a kernel node whose arguments go through ``extra``."""
        ...

    def link(self, inputs: Sequence[tuple[int, bytes, str]]) -> tuple[bytes, str]:
        """Link ``(hiprtcJITInputType, code, name)`` inputs with the runtime's linker:
        (the image, the information log); see ``Backend.program_link``."""
        ...

    def copy_batch(
        self, dsts: Sequence[int], srcs: Sequence[int], sizes: Sequence[int], stream: Any
    ) -> None:
        """Issue the host-to-device copies ``srcs[i] -> dsts[i]`` of ``sizes[i]`` bytes in
        one call (:attr:`batch_copy_call`) on ``stream``: in stream order as a whole, in
        no order among themselves, so no two may overlap. The sources are read in
        stream order: the caller keeps them until a fence or a synchronise behind the
        batch has completed. Raises the runtime's failure as HipError."""
        ...


def _outputs(result: Sequence[Any]) -> Any:
    """A binding's outputs after its result code: None, one value, or a tuple."""
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def import_bindings(
    load: Callable[[], tuple[Any, Any]],
    *,
    backend: str,
    package: str,
    library: str,
    missing: tuple[type[Exception], ...] = (ImportError,),
    broken: tuple[type[Exception], ...] = (),
) -> tuple[Any, Any]:
    """``load()``'s (driver, compiler) binding modules, or BackendUnavailable: naming
    ``package`` when an exception in ``missing`` says it is not installed, ``library``
    when one in ``broken`` says its native library could not be loaded."""
    try:
        return load()
    except missing as exc:
        raise BackendUnavailable(
            E.hipErrorInsufficientDriver,
            f"{backend} backend unavailable: the {package} package is not installed "
            f"(pip install 'hipr[{backend}]'): {exc}",
            library=package,
        ) from exc
    except broken as exc:
        raise BackendUnavailable(
            E.hipErrorInsufficientDriver,
            f"{backend} backend unavailable: could not load {library} ({exc})",
            library=library,
        ) from exc


class RuntimeBase:
    """The plumbing every runtime adapter shares: calling its binding modules (every
    function returns ``(result, outputs...)``) and turning failures into
    :class:`~hipr.errors.HipError` or :class:`~hipr.backends.BackendUnavailable`.

    A subclass sets the class attributes, :meth:`load_bindings` and :meth:`error`, and
    implements the rest of :class:`Runtime`. ``api``/``rtc_api`` replace the binding
    modules (tests run the adapters on simulated ones); with ``api`` None both are
    imported."""

    name: str
    #: The native library named in "backend unavailable" messages.
    library: str
    #: The compiler's native library, named when it cannot be loaded.
    rtc_library: str
    # The data half of Runtime, set by each adapter (see Runtime for what each means).
    calls: DriverCalls[str]
    rtc_calls: RtcCalls[str]
    rtc_images: tuple[tuple[str, str], ...]
    param_info_call: str | None
    not_ready: int
    batch_copy_call: str | None = None

    def __init__(self, api: Any = None, rtc_api: Any = None) -> None:
        # Only the real bindings' library may be opened for its C entry points: a
        # simulated binding on a GPU host must never reach the real driver.
        self._real_library = api is None
        if api is None:
            api, real_rtc = self.load_bindings()
            rtc_api = rtc_api or real_rtc
        self.api: Any = api
        self.rtc_api: Any = rtc_api

    def native_entries(self) -> tuple[int, int] | None:
        """The C addresses of the runtime's kernel launch and stream query (for the
        native launch-and-wait, ``hipr.backends._launch_wait``); None where there are
        none to give. A simulated binding offers its own through ``native_entries()``."""
        offered = getattr(self.api, "native_entries", None)
        if offered is not None:
            entries: tuple[int, int] | None = offered()
            return entries
        if not self._real_library:
            return None
        try:
            library = ctypes.CDLL(self.library)
            launch = getattr(library, self.calls.launch_kernel)
            query = getattr(library, self.calls.stream_query)
        except (OSError, AttributeError):
            return None
        return entry_address(launch), entry_address(query)

    @staticmethod
    def load_bindings() -> tuple[Any, Any]:
        """Import the (driver, compiler) binding modules, or raise BackendUnavailable."""
        raise NotImplementedError

    def error(self, code: int, call: str) -> HipError:
        """The HipError for result ``code`` of driver call ``call``."""
        raise NotImplementedError

    def call(self, fn: str, *args: Any) -> Any:
        """Call driver function ``fn``; raise its failure as HipError, return its outputs."""
        result = getattr(self.api, fn)(*args)
        err = int(result[0])
        if err != SUCCESS:
            raise self.error(err, fn)
        return _outputs(result)

    def raw(self, fn: str, *args: Any) -> Any:
        """Call driver function ``fn``; its result tuple, unchecked."""
        return getattr(self.api, fn)(*args)

    def function(self, fn: str) -> Callable[..., Any]:
        """Driver function ``fn`` itself (see :meth:`Runtime.function`)."""
        function: Callable[..., Any] = getattr(self.api, fn)
        return function

    def provides(self, fn: str) -> bool:
        """True when the driver binding has ``fn`` (older ones lack newer calls)."""
        return getattr(self.api, fn, None) is not None

    def copy_batch(
        self, dsts: Sequence[int], srcs: Sequence[int], sizes: Sequence[int], stream: Any
    ) -> None:
        """A runtime without :attr:`batch_copy_call` has none (the backend never asks)."""
        raise HipError(E.hipErrorNotSupported, f"the {self.name} runtime has no batch copy")

    def link(self, inputs: Sequence[tuple[int, bytes, str]]) -> tuple[bytes, str]:
        """A runtime without a linker adapter has none."""
        raise HipError(E.hipErrorNotSupported, f"the {self.name} runtime has no device linker")

    def rtc_call(self, fn: str, *args: Any) -> Any:
        """Call compiler function ``fn``; raise its failure as HipError, return its
        outputs. A compiler library that cannot be loaded is hipErrorNotSupported: the
        backend still runs precompiled code."""
        try:
            result = getattr(self.rtc_api, fn)(*args)
        except (OSError, RuntimeError) as exc:
            raise HipError(
                E.hipErrorNotSupported,
                f"{self.name} backend cannot compile: could not load {self.rtc_library} ({exc})",
            ) from exc
        err = int(result[0])
        if err != SUCCESS:
            raise rtc_error(err, fn)
        return _outputs(result)

    def rtc_raw(self, fn: str, *args: Any) -> Any:
        """Call compiler function ``fn``; its result tuple, unchecked."""
        return getattr(self.rtc_api, fn)(*args)

    def unavailable(self, code: int, reason: str) -> BackendUnavailable:
        """BackendUnavailable with HIP code ``code``, naming this runtime's library."""
        return BackendUnavailable(
            code, f"{self.name} backend unavailable: {reason}", library=self.library
        )

    def could_not_load(self, exc: BaseException) -> BackendUnavailable:
        """BackendUnavailable for a native library that failed to load."""
        # hip-python's loader quotes bytes reprs ("failed to dlopen 'b'libamdhip64.so''");
        # people read this line, so it shows the names as text.
        text = re.sub(r"b'([^']*)'", r"\1", str(exc))
        return self.unavailable(
            E.hipErrorInsufficientDriver, f"could not load {self.library} ({text})"
        )

    def no_device(self, vendor: str) -> BackendUnavailable:
        """BackendUnavailable for a runtime that loaded but sees no GPU of ``vendor``."""
        return self.unavailable(
            E.hipErrorNoDevice, f"{self.library} loaded but sees no {vendor} GPU"
        )


def cstr(value: Any) -> str:
    """A C string from a runtime binding (bytes with a NUL tail, a CStr, or str) as text."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).split(b"\0", 1)[0].decode(errors="replace")
    return str(value).split("\0", 1)[0].strip()


def with_default_target(options: list[str], chose_target: bool, default: str) -> list[str]:
    """Compiler ``options`` with ``default`` (the flag naming the device's own target)
    first, unless the user chose a target themselves."""
    return options if chose_target else [default, *options]
