"""The GPU backend's modules and kernels: compiling (through the compile cache),
loading, launching."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from hipr.backends._code_cache import CodeCache
from hipr.backends._errmap import rtc_error
from hipr.backends._gpu_core import GpuCore
from hipr.backends._gpu_handles import GpuModule, GpuStream, live
from hipr.backends._image_kind import check_image
from hipr.backends._launch_extra import LaunchExtra, ReusedLaunchExtra, check_dims
from hipr.backends._launch_wait import (
    DONE,
    LAUNCH_FAILED,
    MAX_WAIT_STREAMS,
    QUERY_FAILED,
    LaunchMany,
    LaunchWait,
    PreparedLaunchWait,
)
from hipr.backends._runtime import INVALID_VALUE, SUCCESS
from hipr.backends.interface import Dim3, Handle
from hipr.errors import HipError, HipErrorCode
from hipr.kernels.builtins import BUILTIN_SOURCE
from hipr.kernels.kernel_args import MAX_ARGS_BYTES

E = HipErrorCode


@dataclass(frozen=True, slots=True)
class PreparedWait:
    """A launch-and-wait packed once (:meth:`GpuKernels.prepare_waited`): the call, the
    argument buffer it points to, and the lane state it was packed for (the lane, its
    device, its default streams and how many) that :meth:`GpuKernels.waited_again`
    checks before each call."""

    call: PreparedLaunchWait
    extra: LaunchExtra
    lane: Any
    device: int
    defaults: dict[int, Any]
    default_count: int


#: A parameter-info query stops here even if the driver never says "past the end".
_MAX_PARAMS = 4096


class GpuKernels(GpuCore):
    """The GPU backend's modules and kernels: compile (cached), load, launch."""

    def compile(
        self,
        source: str,
        name: str,
        options: Sequence[str],
        headers: Sequence[tuple[str, str]] = (),
    ) -> bytes:
        """HIP C++ to a code object for the current device with the runtime's compiler
        (NVRTC with a HIP prelude, or hiprtc); hipErrorInvalidSource with the compiler
        log when the source is refused. ``headers``: ``(include name, contents)`` given
        to the compiler as in-memory files. Cached in-process by sha256 of (source and
        headers, effective options, arch)."""
        device = self._current()
        arch = self.device_properties(device).arch
        opts = self._rt.compile_options(options, arch)
        keyed = source
        if headers:
            # NUL never occurs in C++ source text: the pairs cannot run together.
            keyed = "\0".join((source, *(f"{n}\0{t}" for n, t in headers)))
        key = CodeCache.key(keyed, opts, arch)
        cached = self._code_cache.get(key)
        if cached is not None:
            return cached
        image = self._compile_program(source, name, opts, headers)
        self._code_cache.put(key, image)
        return image

    def program_link(self, inputs: Sequence[tuple[int, bytes, str]]) -> tuple[bytes, str]:
        """Link compiled inputs for the current device with the runtime's linker (cuLink*
        on cuda, hiprtcLink* on hip); see :meth:`Backend.program_link`."""
        self._current()
        return self._rt.link(inputs)

    def _compile_program(
        self, source: str, name: str, opts: list[str], user_headers: Sequence[tuple[str, str]] = ()
    ) -> bytes:
        rtc = self._rt.rtc_calls
        headers, includes = self._rt.program_headers()
        # The program's own headers after the runtime's; one named as a runtime header
        # (the cuda prelude's hip/hip_runtime.h) is the runtime's to give.
        own = [(n.encode(), t.encode()) for n, t in user_headers if n.encode() not in includes]
        headers = [*headers, *(t for _, t in own)]
        includes = [*includes, *(n for n, _ in own)]
        prog = self._rt.rtc_call(
            rtc.create_program,
            source.encode(),
            (name or "kernel.hip").encode(),
            len(headers),
            headers,
            includes,
        )
        try:
            (err,) = self._rt.rtc_raw(
                rtc.compile_program, prog, len(opts), [o.encode() for o in opts]
            )
            log = self._program_log(prog)
            if int(err) != SUCCESS:
                raise rtc_error(int(err), f"{rtc.compile_program} of {name!r}", log)
            return self._program_image(prog)
        finally:
            self._rt.rtc_raw(rtc.destroy_program, prog)

    def _program_image(self, prog: Any) -> bytes:
        *fallbacks, (size_fn, read_fn) = self._rt.rtc_images
        for try_size, try_read in fallbacks:
            try:
                size = int(self._rt.rtc_call(try_size, prog))
            except HipError:
                size = 0  # e.g. a virtual architecture: there is no CUBIN, only PTX
            if size > 0:
                return self._read_program(try_read, prog, size)
        return self._read_program(read_fn, prog, int(self._rt.rtc_call(size_fn, prog)))

    def _read_program(self, fn: str, prog: Any, size: int) -> bytes:
        buf = self._rt.output_buffer(size)
        self._rt.rtc_call(fn, prog, buf)
        return bytes(buf)

    def _program_log(self, prog: Any) -> str:
        rtc = self._rt.rtc_calls
        size = int(self._rt.rtc_call(rtc.program_log_size, prog))
        if size <= 1:
            return ""
        buf = self._rt.output_buffer(size)
        self._rt.rtc_call(rtc.program_log, prog, buf)
        return bytes(buf).rstrip(b"\0").decode(errors="replace")

    def module_load(self, image: bytes) -> Handle:
        """Load a code object (on CUDA: a CUBIN, fatbin or PTX image) on the current
        device."""
        device = self._current()
        check_image(self._rt.name, image)
        raw = self._call(self._calls.module_load_data, self._rt.loadable_image(bytes(image)))
        handle = self._track(self._ledger.modules, GpuModule(raw, device))
        if self._rt.param_info_call is None:
            self._amdhsa.add_module(id(handle), bytes(image))
        return handle

    def module_unload(self, module: Handle) -> None:
        """Unload a module; the shared built-in module is left loaded."""
        live(module, GpuModule, "module")
        if module.builtin:
            return
        fn, modules = self._calls.module_unload, self._ledger.modules
        self._destroy(module, GpuModule, "module", fn, modules, self._forget_param_sizes)

    def _forget_param_sizes(self, module: GpuModule) -> None:
        # A later module's function may reuse an address whose parameter size is known.
        self._param_sizes.clear()
        self._last_launch = None
        self._amdhsa.forget_module(id(module))

    def module_get_function(self, module: Handle, name: str) -> Handle:
        """A kernel of the module; hipErrorNotFound when it has none of that name."""
        raw = live(module, GpuModule, "module")
        self._current()
        function = self._call(self._calls.module_get_function, raw, name.encode())
        if self._rt.param_info_call is None:
            self._amdhsa.add_function(int(function), id(module), name)
        return function

    def builtin_module(self) -> Handle:
        """hipr's built-in kernels, compiled and loaded once per device."""
        device = self._current()
        with self._builtin_lock:
            module = self._builtin.get(device)
            if module is None:
                image = self.compile(BUILTIN_SOURCE, "hipr_builtins.hip", ())
                raw = self._call(self._calls.module_load_data, image)
                module = GpuModule(raw, device, builtin=True)
                self._builtin[device] = module
                if self._rt.param_info_call is None:
                    self._amdhsa.add_module(id(module), bytes(image))
            return module

    def launch(
        self,
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        stream: Handle | None,
        args: bytes,
    ) -> None:
        """A kernel launch with ``args`` through the ``extra`` buffer-pointer path."""
        check_dims(grid, block)
        raw_stream, extra = self._launch_target(stream)
        size = self._param_size(function)
        self._issue(function, (*grid, *block), shared_mem, raw_stream, extra, size, args)

    def launcher(
        self,
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        stream: Handle | None,
    ) -> Callable[[bytes], None]:
        """:meth:`launch` of one configuration, made ready once for many launches (a
        batch): the geometry's check, the stream and the thread's ``extra`` array are
        looked up here, and each call costs the argument buffer's copy and the runtime's
        launch. Call it on the thread that runs the launches."""
        raw_stream, extra, size = self._shared_by_launches(function, grid, block, stream)
        return partial(self._issue, function, (*grid, *block), shared_mem, raw_stream, extra, size)

    def batch_launcher(
        self,
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        stream: Handle | None,
    ) -> Callable[[Sequence[bytes]], list[HipError | None]] | None:
        """:meth:`launcher` for a whole run of argument buffers at once, made in one
        native call (``LaunchMany``): the callable gives each buffer's error, or None for
        a launch made. None where the native library is not to be had (the caller then
        launches them one by one). Call it on the thread that runs the launches."""
        native = self._launch_wait
        if native is None:
            return None
        raw_stream, _, size = self._shared_by_launches(function, grid, block, stream)
        return partial(
            self._issue_all, native.many, int(function), (*grid, *block), shared_mem,
            int(raw_stream), size,
        )  # fmt: skip

    def _shared_by_launches(
        self, function: Handle, grid: Dim3, block: Dim3, stream: Handle | None
    ) -> tuple[Any, ReusedLaunchExtra, int | None]:
        """What a run of launches shares, made ready once: the geometry checked, the raw
        stream and the thread's ``extra`` array, and the kernel's parameter space (once
        for the batch, not per launch)."""
        check_dims(grid, block)
        raw_stream, extra = self._launch_target(stream)
        return raw_stream, extra, self._param_size(function)

    def _issue_all(
        self,
        many: LaunchMany,
        function: int,
        dims: tuple[int, ...],
        shared_mem: int,
        raw_stream: int,
        param_size: int | None,
        blobs: Sequence[bytes],
    ) -> list[HipError | None]:
        """The runtime's launches of ``blobs`` through ``many`` (see :meth:`_issue`)."""
        packed = [
            blob if param_size is None or len(blob) <= param_size else _fit(param_size, blob)
            for blob in blobs
        ]
        results = many.run(function, dims, shared_mem, raw_stream, packed, self._extra_words)
        call = self._calls.launch_kernel
        return [None if code == SUCCESS else self._rt.error(code, call) for code in results]

    def _issue(
        self,
        function: Handle,
        dims: tuple[int, ...],
        shared_mem: int,
        raw_stream: Any,
        extra: ReusedLaunchExtra,
        param_size: int | None,
        args: bytes,
    ) -> None:
        """The runtime's launch of ``args`` (grid and block in ``dims``; the kernel's
        parameter space ``param_size``, as :meth:`_param_size` gave it), the rest ready."""
        packed = args if param_size is None or len(args) <= param_size else _fit(param_size, args)
        if len(packed) <= extra.capacity:
            address = extra.fill(packed)
        else:  # more than the protocol carries (a direct caller): a buffer of its own
            fresh = self._extra(packed)
            address = fresh.address
        # The runtime's function bound once (the launch is the hot path): no look-up by
        # name, no generic result handling, per launch.
        result = self._launch_kernel(function, *dims, shared_mem, raw_stream, None, address)
        err = int(result[0])
        if err != SUCCESS:
            raise self._rt.error(err, self._calls.launch_kernel)

    def launch_waited(
        self,
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        args: bytes,
        streams: Sequence[Handle],
        spin_seconds: float,
        reply: tuple[int, bytes] | None = None,
    ) -> tuple[bool, HipError | None, int] | None:
        """:meth:`launch` on the lane's default stream, then :meth:`work_done` asked until
        it says done or ``spin_seconds`` pass, as one native call (``_launch_wait``);
        once done, ``reply`` (a socket descriptor and a frame) is sent from there too.
        ``(done, None, sent)`` with the bytes of the reply sent (0: none; negative: the
        send's ``-errno``); ``(False, error, 0)`` when the runtime refused the launch
        (nothing polled, nothing sent); None, with nothing done, where the native call
        is not to be had. A failed query (a faulted kernel) raises, as :meth:`work_done`
        does."""
        target = self._waited_target(function, grid, block, shared_mem, args, streams)
        if target is None:
            return None
        native, address_of_function, dims, packed, first, extra, others = target
        held: LaunchExtra | None = None
        if len(packed) <= extra.capacity:
            address = extra.fill(packed)
        else:  # more than the protocol carries (a direct caller): a buffer of its own
            held = self._extra(packed)
            address = held.address
        status = native.run(
            address_of_function, dims, shared_mem, first, others, address, spin_seconds, reply
        )
        del held  # kept alive through the call
        return self._waited_outcome(native, status, reply is not None)

    def prepare_waited(
        self,
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        args: bytes,
        streams: Sequence[Handle],
        spin_seconds: float,
        reply: bytes,
        request_id_at: int,
    ) -> PreparedWait | None:
        """:meth:`launch_waited`'s call packed once, for :meth:`waited_again` to make
        unchanged while the lane and ``streams`` stay as they are now (the express
        path's loop over one kernel: PyTorch's ``add_`` then a synchronize): its reply is
        ``reply`` with the request id at byte ``request_id_at``. The launch's argument
        bytes get a buffer of their own. None where :meth:`launch_waited` would be."""
        target = self._waited_target(function, grid, block, shared_mem, args, streams)
        if target is None:
            return None
        native, address_of_function, dims, packed, first, _, others = target
        extra = self._extra(packed)
        call = PreparedLaunchWait(
            native, address_of_function, dims, shared_mem, first, others, extra.address,
            spin_seconds, reply, request_id_at,
        )  # fmt: skip
        lane: Any = self._lanes.state
        defaults: dict[int, Any] = lane.default_streams  # made by _launch_target
        return PreparedWait(call, extra, lane, lane.device, defaults, len(defaults))

    def waited_again(
        self, lane: Any, prepared: PreparedWait, fd: int, request_id: int
    ) -> tuple[bool, HipError | None, int] | None:
        """The call :meth:`prepare_waited` packed in ``lane`` (a session's, its owner
        thread idle), made again on the calling thread, its reply (now request
        ``request_id``'s) sent to ``fd`` (-1: not sent): :meth:`launch_waited`'s
        outcome. None, with nothing done, where the lane has changed since (another
        device, another default stream): the caller goes the usual way. Binds the
        lane's device as :meth:`run_in_lane` would; the lane is not borrowed, since
        nothing here reads it but these checks."""
        if (
            lane is not prepared.lane
            or getattr(lane, "device", None) != prepared.device
            or getattr(lane, "default_streams", None) is not prepared.defaults
            or len(prepared.defaults) != prepared.default_count
        ):
            return None
        self._bind_loop(prepared.device)
        call = prepared.call
        status = call.again(fd, request_id)
        return self._waited_outcome(call, status, fd >= 0)

    def _waited_target(
        self,
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        args: bytes,
        streams: Sequence[Handle],
    ) -> tuple[LaunchWait, int, tuple[int, ...], bytes, int, ReusedLaunchExtra, list[int]] | None:
        """What a launch-and-wait needs (:meth:`launch_waited`, :meth:`prepare_waited`):
        the native call, the function's address, the six dimensions, the fitted
        arguments, the lane's default stream, the thread's ``extra`` array and the other
        streams to poll; None without the native call or with too many streams."""
        native = self._launch_wait
        if native is None:
            return None
        address_of_function, dims, packed = self._checked_launch(
            function, grid, block, shared_mem, args
        )
        raw_stream, extra = self._launch_target(None)
        first = int(raw_stream)
        others = self._streams_to_wait(first, streams)
        if others is None:
            return None
        return native, address_of_function, dims, packed, first, extra, others

    def _checked_launch(
        self, function: Handle, grid: Dim3, block: Dim3, shared_mem: int, args: bytes
    ) -> tuple[int, tuple[int, ...], bytes]:
        """The function's address, the launch's six dimensions (checked) and its
        argument bytes fitted to the kernel's parameters."""
        # The same objects as the last call's (the express path's checked payload, a
        # loop over one kernel): their checks, sizes and packing are the last call's. The
        # slot holds them, so an identity cannot be reused by another object meanwhile.
        last = self._last_launch
        if (
            last is not None
            and last[0] is function
            and last[1] is grid
            and last[2] is block
            and last[3] == shared_mem
            and last[4] is args
        ):
            return last[5], last[6], last[7]
        check_dims(grid, block)
        size = self._param_size(function)
        packed = args if size is None or len(args) <= size else _fit(size, args)
        address_of_function, dims = int(function), (*grid, *block)
        self._last_launch = (
            function, grid, block, shared_mem, args, address_of_function, dims, packed
        )  # fmt: skip
        return address_of_function, dims, packed

    def _streams_to_wait(self, first: int, streams: Sequence[Handle]) -> list[int] | None:
        """The raw streams a waited launch polls besides its own (``first``): the lane's
        default streams on its other devices, then ``streams``; None when there are
        more than the native call takes."""
        others: list[int] = []
        defaults: dict[int, Any] = self._tls.default_streams  # made by _launch_target
        if len(defaults) > 1:
            others += [int(raw) for raw in defaults.values() if int(raw) != first]
        if streams:
            others += [int(live(s, GpuStream, "stream")) for s in streams]
        return None if len(others) > MAX_WAIT_STREAMS else others

    def _waited_outcome(
        self, native: LaunchWait | PreparedLaunchWait, status: int, with_reply: bool
    ) -> tuple[bool, HipError | None, int]:
        """A launch-and-wait's status as :meth:`launch_waited` returns it."""
        if status == DONE:
            return True, None, native.reply_sent() if with_reply else 0
        if status == LAUNCH_FAILED:
            code = native.results().launch_result
            return False, self._rt.error(code, self._calls.launch_kernel), 0
        if status == QUERY_FAILED:
            raise self._rt.error(native.results().query_result, self._calls.stream_query)
        return False, None, 0

    def _launch_target(self, stream: Handle | None) -> tuple[Any, ReusedLaunchExtra]:
        """The raw stream of a launch and the calling thread's reused ``extra`` array."""
        # The lane's device and default stream read once (the launch is the hot path;
        # _current() and _stream() would each look the lane up again).
        lane = self._lanes.state
        device = getattr(lane, "device", None)
        if device is None:
            device = self._current()
        if stream is None:
            defaults: dict[int, Any] | None = getattr(lane, "default_streams", None)
            raw_stream = defaults.get(device) if defaults else None
            if raw_stream is None:
                raw_stream = self._default_stream()
        else:
            raw_stream = live(stream, GpuStream, "stream")
        extra: ReusedLaunchExtra | None = getattr(self._launch_extras, "extra", None)
        if extra is None:
            pointer, size, end = self._extra_words
            extra = ReusedLaunchExtra(
                MAX_ARGS_BYTES, buffer_pointer=pointer, buffer_size=size, end=end
            )
            self._launch_extras.extra = extra
        return raw_stream, extra

    def _param_size(self, function: Any) -> int | None:
        """Bytes of ``function``'s parameter space (end of its last parameter), from the
        runtime's parameter-info call; None where it cannot say (HIP; CUDA before 12.4)."""
        call = self._rt.param_info_call
        if call is None:
            return None
        key = int(function)
        if key in self._param_sizes:
            return self._param_sizes[key]
        size: int | None = None
        if self._rt.provides(call):
            end, index = 0, 0
            while index < _MAX_PARAMS:
                result = self._rt.raw(call, function, index)
                err = int(result[0])
                if err != SUCCESS:
                    # Past the last parameter the driver says INVALID_VALUE; anything
                    # else (NOT_SUPPORTED, ...) means it cannot tell us.
                    size = end if err == INVALID_VALUE else None
                    break
                end = int(result[1]) + int(result[2])
                index += 1
        self._param_sizes[key] = size
        return size

    def function_params(self, function: Handle) -> list[tuple[int, int, bool]]:
        """Each parameter's (offset, size) from the runtime's parameter-info call
        (``cuFuncGetParamInfo``, CUDA 12.4+; pointer-ness is not reported there), or on
        HIP from the code object's ``amdhsa.kernels`` metadata (hipr.kernels.amdhsa, which
        also says which are pointers). hipErrorNotSupported where neither tells (a HIP
        code object without metadata; CUDA drivers before 12.4)."""
        call = self._rt.param_info_call
        if call is None:
            found = self._amdhsa.params(int(function))
            if found is not None:
                return found
        if call is None or not self._rt.provides(call):
            raise HipError(
                HipErrorCode.hipErrorNotSupported,
                "this runtime cannot report a kernel's parameter layout",
            )
        params: list[tuple[int, int, bool]] = []
        while len(params) < _MAX_PARAMS:
            result = self._rt.raw(call, function, len(params))
            err = int(result[0])
            if err == INVALID_VALUE:
                break  # past the last parameter
            if err != SUCCESS:
                raise HipError(
                    HipErrorCode.hipErrorNotSupported,
                    f"{call} failed ({err}): the kernel's parameter layout is unknown",
                )
            params.append((int(result[1]), int(result[2]), False))
        return params

    def function_attribute(self, function: Handle, attribute: int, value: int | None) -> int:
        """A kernel's attribute (CUfunction_attribute numbering), set to ``value`` first
        when one is given; hipErrorNotSupported where the runtime adapter cannot (HIP for
        now)."""
        call = getattr(self._rt, "function_attribute", None)
        if call is None:
            raise HipError(
                HipErrorCode.hipErrorNotSupported,
                "kernel attributes are served on cuda workers only",
            )
        self._current()
        return int(call(function, attribute, value))

    def module_global(self, module: Handle, name: str) -> tuple[int, int]:
        """A module's global variable: its device address and size in bytes;
        hipErrorNotFound when it has none of that name, hipErrorNotSupported where the
        runtime adapter cannot tell."""
        raw = live(module, GpuModule, "module")
        call = getattr(self._rt, "module_global", None)
        if call is None:
            raise HipError(
                HipErrorCode.hipErrorNotSupported,
                f"the {self._rt.name} runtime adapter cannot give a module's globals",
            )
        self._current()
        ptr, size = call(raw, name)
        return int(ptr), int(size)

    def function_occupancy(
        self, function: Handle, query: str, numbers: dict[str, Any]
    ) -> dict[str, int]:
        """The driver's occupancy figure ``query`` for a kernel (see the FUNCTION_OCCUPANCY
        handler); hipErrorNotSupported where the runtime adapter cannot (HIP for now)."""
        call = getattr(self._rt, "function_occupancy", None)
        if call is None:
            raise HipError(
                HipErrorCode.hipErrorNotSupported, "occupancy is served on cuda workers only"
            )
        self._current()
        result: dict[str, int] = call(function, query, numbers)
        return result

    def _fit_args(self, function: Any, args: bytes) -> bytes:
        """``args`` without zero tail padding past the kernel's last parameter.

        A packer that rounds the buffer up to the largest alignment, as ``sizeof`` of a
        struct would, leaves bytes the kernel does not have, and CUDA refuses such a
        launch with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES. HIP does not care, so the same
        client code must work here: trailing zeros shorter than one alignment unit (16
        bytes) are dropped; anything else goes to the driver unchanged, to be judged."""
        size = self._param_size(function)
        if size is None or len(args) <= size:
            return args
        return _fit(size, args)

    def _extra(self, args: bytes) -> LaunchExtra:
        pointer, size, end = self._extra_words
        return LaunchExtra(args, buffer_pointer=pointer, buffer_size=size, end=end)


def _fit(size: int, args: bytes) -> bytes:
    """``args`` (longer than the kernel's ``size`` bytes of parameters) cut to ``size``
    when what is past it is zero padding shorter than one alignment unit (16 bytes);
    else unchanged, for the driver to judge (see ``_fit_args``)."""
    tail = args[size:]
    if len(tail) < 16 and not any(tail):
        return args[:size]
    return args
