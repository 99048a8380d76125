"""The native launch-and-wait (``hipr.backends._launch_wait``, ``native/launch_wait.c``):
the C library on its own under AddressSanitizer and UndefinedBehaviorSanitizer, and both
GPU backends' ``launch_waited`` on the simulated runtimes of
:mod:`tests.backends.test_gpu_backends_nogpu`, whose entry points it then calls through C:
the same bytes reach the runtime as through ``launch``, a refused launch and a faulted
kernel come back as the runtime's errors, and a kernel still running is told apart."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hipr.backends import _launch_wait
from hipr.errors import HipError, HipErrorCode
from hipr.kernels.builtins import BUILTIN_SOURCE
from hipr.protocol import Flags, Opcode, encode_frame
from hipr.protocol.header import REQUEST_ID_AT
from tests.backends.test_gpu_backends_nogpu import _fill_args, _make
from tests.proxy.sanitized import SANITIZED_FLAGS, cc, run_clean

E = HipErrorCode
CHECK = Path(__file__).parent / "c" / "launch_wait_check.c"


@pytest.fixture(params=["cuda", "hip"])
def native_sim(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """A simulated GPU backend whose runtime offers native entry points."""
    backend, gpu = _make(str(request.param), native=True)
    if backend._launch_wait is None:
        backend.close()
        pytest.fail("the native launch-and-wait library could not be built or loaded")
    backend.bind_thread(0)
    yield backend, gpu
    backend.close()


def _fill(backend: Any) -> Any:
    return backend.module_get_function(backend.builtin_module(), "fill_f32")


def _read(backend: Any, ptr: int, n: int) -> np.ndarray:
    out = np.empty(n, np.float32)
    backend.memcpy_dtoh(out.data, ptr)
    return out


def test_a_launch_waited_for_runs_and_reports_done(native_sim: tuple[Any, Any]) -> None:
    backend, gpu = native_sim
    fill, n = _fill(backend), 8
    x = backend.malloc(4 * n)
    before = len(gpu.launches)
    assert backend.launch_waited(
        fill, (1, 1, 1), (32, 1, 1), 0, _fill_args(x, 3.0, n), [], 1e-3
    ) == (True, None, 0)
    # A sizeof-style packer's tail: trimmed for CUDA as launch() trims it, kept for HIP.
    padded = _fill_args(x, 4.0, n) + b"\0" * 8
    assert backend.launch_waited(fill, (1, 1, 1), (32, 1, 1), 0, padded, [], 1e-3) == (
        True,
        None,
        0,
    )
    sent = [args for _, args in gpu.launches[before:]]
    assert sent[0] == _fill_args(x, 3.0, n)
    assert sent[1] == (_fill_args(x, 4.0, n) if backend.name == "cuda" else padded)
    assert (_read(backend, x, n) == 4.0).all()
    assert gpu.native is not None and gpu.native.queries >= 2  # polled through C


def test_every_stream_of_the_session_is_waited_for(native_sim: tuple[Any, Any]) -> None:
    """Done means the session's other streams are idle too, as ``work_done`` says."""
    backend, gpu = native_sim
    fill, n = _fill(backend), 4
    x, y = backend.malloc(4 * n), backend.malloc(4 * n)
    stream = backend.stream_create()
    backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, stream, _fill_args(y, 7.0, n))
    assert gpu.native is not None
    gpu.native.queries = 0
    done = backend.launch_waited(
        fill, (1, 1, 1), (32, 1, 1), 0, _fill_args(x, 1.0, n), [stream], 1e-3
    )
    assert done == (True, None, 0)
    assert gpu.native.queries >= 2  # the launch's stream and the session's other one
    assert (_read(backend, y, n) == 7.0).all()
    backend.stream_destroy(stream)


def test_the_reply_leaves_once_the_work_is_done(native_sim: tuple[Any, Any]) -> None:
    """With a descriptor, the reply is sent the moment the work is seen done, and only
    then: not for a kernel still running, nor for a refused launch."""
    backend, gpu = native_sim
    fill, n = _fill(backend), 4
    x = backend.malloc(4 * n)
    ours, peer = socket.socketpair()
    with ours, peer:
        peer.setblocking(False)
        reply = (ours.fileno(), b"reply-frame")
        args = _fill_args(x, 5.0, n)
        outcome = backend.launch_waited(fill, (1, 1, 1), (32, 1, 1), 0, args, [], 1e-3, reply)
        assert outcome == (True, None, len(reply[1]))
        assert peer.recv(64) == b"reply-frame"
        assert gpu.native is not None
        gpu.native.not_ready_polls = 10**9
        outcome = backend.launch_waited(fill, (1, 1, 1), (32, 1, 1), 0, args, [], 0.0, reply)
        assert outcome == (False, None, 0)
        gpu.native.not_ready_polls = 0
        refused = backend.launch_waited(fill, (1, 1, 1), (2048, 1, 1), 0, args, [], 1e-3, reply)
        assert refused is not None and refused[1] is not None and refused[2] == 0
        with pytest.raises(BlockingIOError):
            peer.recv(64)  # nothing more was sent
        backend.synchronize()
    # A descriptor that is no socket: the send's -errno, the work still done.
    outcome = backend.launch_waited(fill, (1, 1, 1), (32, 1, 1), 0, args, [], 1e-3, (10**6, b"x"))
    assert outcome is not None and outcome[:2] == (True, None) and outcome[2] < 0
    with pytest.raises(ValueError, match="at most 64 bytes"):
        backend.launch_waited(fill, (1, 1, 1), (32, 1, 1), 0, args, [], 1e-3, (1, b"x" * 65))


def test_a_kernel_still_running_when_the_poll_ends(native_sim: tuple[Any, Any]) -> None:
    backend, gpu = native_sim
    fill, n = _fill(backend), 4
    x = backend.malloc(4 * n)
    assert gpu.native is not None
    gpu.native.not_ready_polls = 10**9  # never seen done while polling
    assert backend.launch_waited(
        fill, (1, 1, 1), (32, 1, 1), 0, _fill_args(x, 2.0, n), [], 0.0
    ) == (False, None, 0)
    gpu.native.not_ready_polls = 0
    backend.synchronize()
    assert (_read(backend, x, n) == 2.0).all()


def test_a_refused_launch_is_the_runtimes_error(native_sim: tuple[Any, Any]) -> None:
    backend, gpu = native_sim
    fill = _fill(backend)
    x = backend.malloc(64)
    queries = gpu.native.queries if gpu.native else 0
    # Bytes past the kernel's parameters that are not padding: CUDA refuses the launch
    # (701, LAUNCH_OUT_OF_RESOURCES); HIP takes them.
    args = _fill_args(x, 1.0, 4) + b"\1" * 32
    outcome = backend.launch_waited(fill, (1, 1, 1), (32, 1, 1), 0, args, [], 1e-3)
    if backend.name == "cuda":
        done, error, sent = outcome
        assert not done and isinstance(error, HipError) and sent == 0
        assert error.code == E.hipErrorLaunchOutOfResources
        assert gpu.native is not None and gpu.native.queries == queries  # nothing polled
    else:
        assert outcome == (True, None, 0)
    # Too many threads a block: refused by the runtime on both.
    done, error, _ = backend.launch_waited(
        fill, (1, 1, 1), (2048, 1, 1), 0, _fill_args(x, 1.0, 4), [], 1e-3
    )
    assert not done and error is not None and error.code == E.hipErrorInvalidValue


def test_a_faulted_kernel_raises_as_a_query_would(native_sim: tuple[Any, Any]) -> None:
    backend, gpu = native_sim
    reduce = backend.module_get_function(backend.builtin_module(), "reduce_sum_f32")
    x = backend.malloc(4 * 64)
    out = backend.malloc(4)
    args = np.array([x, out], np.uint64).tobytes() + np.uint64(64).tobytes()
    with pytest.raises(HipError) as info:  # too little shared memory: the sim faults
        backend.launch_waited(reduce, (1, 1, 1), (64, 1, 1), 0, args, [], 1e-3)
    assert info.value.code == E.hipErrorIllegalAddress
    gpu.sticky = 0


def test_without_entry_points_there_is_no_native_call() -> None:
    backend, _ = _make("cuda")
    try:
        assert backend._launch_wait is None
        assert backend.launch_waited(None, (1, 1, 1), (1, 1, 1), 0, b"", [], 0.0) is None
    finally:
        backend.close()


def test_the_library_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIPR_NATIVE_LAUNCH", "0")
    assert _launch_wait.load_launch_wait(1, 2, 600) is None
    monkeypatch.delenv("HIPR_NATIVE_LAUNCH")
    assert _launch_wait.load_launch_wait(0, 2, 600) is None  # no launch entry point


def test_a_library_of_other_sources_is_refused(tmp_path: Path) -> None:
    """A library without the layout's version (built from older sources, or not ours)
    is not used: its structure would be misread."""
    stale = tmp_path / "stale.c"
    stale.write_text("int hipr_launch_wait_abi(void) { return 1; }\n")
    built = tmp_path / "libstale.so"
    cc(["-shared", "-fPIC", str(stale), "-o", str(built)])
    assert _launch_wait._opened(built) is None
    assert _launch_wait._opened(tmp_path / "absent.so") is None
    current = _launch_wait._compiled_into_cache()
    assert current is not None and _launch_wait._opened(current) is not None


def test_the_library_compiles_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the package holds no built library, the first use compiles one, once."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(_launch_wait, "PACKAGED", tmp_path / "absent.so")
    first = _launch_wait._compiled_into_cache()
    assert first is not None and first.is_relative_to(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert _launch_wait._compiled_into_cache() == first
    assert first.stat().st_mtime_ns == stamp


def test_the_c_source_under_sanitizers(tmp_path: Path) -> None:
    """launch_wait.c against fake entry points, built with ASan and UBSan and
    ``-Werror``: every outcome, the stream bound, and no leak or undefined behaviour."""
    binary = tmp_path / "launch_wait_check"
    source = _launch_wait.SOURCE
    shared = Path(__file__).parents[1] / "proxy" / "c"  # check.h
    cc([*SANITIZED_FLAGS, "-I", str(source.parent), "-I", str(shared), str(CHECK), str(source),
        "-o", str(binary)])  # fmt: skip
    run_clean(binary)


def test_the_same_arguments_again_reuse_their_checks(native_sim: tuple[Any, Any]) -> None:
    """The last call's checked geometry and fitted arguments serve the same objects
    again (the express path's cached payload); other objects are checked afresh, and a
    module's unload forgets them."""
    backend, gpu = native_sim
    fill, n = _fill(backend), 4
    x = backend.malloc(4 * n)
    grid, block = (1, 1, 1), (32, 1, 1)
    padded = _fill_args(x, 6.0, n) + b"\0" * 8  # trimmed for CUDA, kept for HIP
    before = len(gpu.launches)
    for _ in range(3):
        assert backend.launch_waited(fill, grid, block, 0, padded, [], 1e-3) == (True, None, 0)
    sent = {args for _, args in gpu.launches[before:]}
    assert sent == {_fill_args(x, 6.0, n) if backend.name == "cuda" else padded}
    assert backend._last_launch is not None and backend._last_launch[4] is padded
    # New geometry objects, one of them bad: checked again, refused by the runtime.
    done, error, _ = backend.launch_waited(fill, grid, (2048, 1, 1), 0, padded, [], 1e-3)
    assert not done and error is not None
    module = backend.module_load(backend.compile(BUILTIN_SOURCE, "k.hip", []))
    backend.module_unload(module)
    assert backend._last_launch is None
    assert (_read(backend, x, n) == 6.0).all()


def _reply(request_id: int) -> bytes:
    """A reply frame of ``request_id`` (the express path's), and where its id lies."""
    return encode_frame(Opcode.LAUNCH_KERNEL, request_id, Flags.REPLY, {})


def test_a_prepared_call_is_made_again_unchanged(native_sim: tuple[Any, Any]) -> None:
    """Packed once, made again with only its reply's socket and request id changed: the
    same bytes reach the runtime each time, the session's other stream is waited for
    each time, and launches of other arguments meanwhile (the loop's shared call
    structure and argument buffer) leave the packed call as it was."""
    backend, gpu = native_sim
    fill, n = _fill(backend), 4
    x, y = backend.malloc(4 * n), backend.malloc(4 * n)
    stream = backend.stream_create()
    lane = backend._lanes.state
    grid, block = (1, 1, 1), (32, 1, 1)
    prepared = backend.prepare_waited(
        fill, grid, block, 0, _fill_args(x, 3.0, n), [stream], 1e-3, _reply(0), REQUEST_ID_AT
    )
    assert prepared is not None
    ours, peer = socket.socketpair()
    with ours, peer:
        peer.setblocking(False)
        before = len(gpu.launches)
        for value, request_id in enumerate((7, 8, 2**32 - 1), start=1):
            backend.launch(fill, grid, block, 0, stream, _fill_args(y, float(value), n))
            other = backend.launch_waited(fill, grid, block, 0, _fill_args(x, 1.0, n), [], 1e-3)
            assert other == (True, None, 0)
            outcome = backend.waited_again(lane, prepared, ours.fileno(), request_id)
            assert outcome == (True, None, len(_reply(request_id)))
            assert peer.recv(64) == _reply(request_id)
            assert (_read(backend, x, n) == 3.0).all()  # its own bytes, not the other's
            assert (_read(backend, y, n) == float(value)).all()  # the stream waited for
        assert [args for _, args in gpu.launches[before:]][2::3] == [_fill_args(x, 3.0, n)] * 3
        # No descriptor: nothing sent, the work done all the same.
        assert backend.waited_again(lane, prepared, -1, 9) == (True, None, 0)
        with pytest.raises(BlockingIOError):
            peer.recv(64)
    backend.stream_destroy(stream)
    with pytest.raises(ValueError, match="outside the reply"):
        backend.prepare_waited(fill, grid, block, 0, b"", [], 1e-3, b"short", REQUEST_ID_AT)


def test_a_prepared_call_is_not_made_in_a_changed_lane(native_sim: tuple[Any, Any]) -> None:
    """The lane it was packed in, on another device, with another default stream, or
    another lane altogether: nothing launched, None (the usual way then)."""
    backend, gpu = native_sim
    fill, n = _fill(backend), 4
    x = backend.malloc(4 * n)
    lane = backend._lanes.state
    args = _fill_args(x, 5.0, n)
    prepared = backend.prepare_waited(
        fill, (1, 1, 1), (32, 1, 1), 0, args, [], 1e-3, _reply(0), REQUEST_ID_AT
    )
    assert prepared is not None
    before = len(gpu.launches)
    assert backend.waited_again(object(), prepared, -1, 1) is None
    lane.device, device = 1, lane.device
    assert backend.waited_again(lane, prepared, -1, 1) is None
    lane.device = device
    lane.default_streams[1] = lane.default_streams[device]  # as if made for device 1
    assert backend.waited_again(lane, prepared, -1, 1) is None
    del lane.default_streams[1]
    lane.default_streams, saved = dict(lane.default_streams), lane.default_streams
    assert backend.waited_again(lane, prepared, -1, 1) is None
    lane.default_streams = saved
    assert len(gpu.launches) == before
    assert backend.waited_again(lane, prepared, -1, 1) == (True, None, 0)
    assert len(gpu.launches) == before + 1


def test_a_prepared_call_the_runtime_refuses_is_its_error(native_sim: tuple[Any, Any]) -> None:
    backend, gpu = native_sim
    fill, n = _fill(backend), 4
    x = backend.malloc(4 * n)
    lane = backend._lanes.state
    prepared = backend.prepare_waited(
        fill, (1, 1, 1), (2048, 1, 1), 0, _fill_args(x, 1.0, n), [], 1e-3, _reply(0), REQUEST_ID_AT
    )
    assert prepared is not None
    before = len(gpu.launches)
    for _ in range(2):
        done, error, sent = backend.waited_again(lane, prepared, -1, 1)
        assert not done and sent == 0
        assert isinstance(error, HipError) and error.code == E.hipErrorInvalidValue
    assert len(gpu.launches) == before


def test_a_batch_is_launched_in_one_native_call(
    native_sim: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """LAUNCH_KERNELS's launches (``_launch_each``) go through ``hipr_launch_many``, never
    one binding call each: every buffer reaches the runtime as ``launch`` would pass it
    (a padded tail trimmed for CUDA), in order; a launch the runtime refuses stops none
    after it and is named; a stream that cannot launch fails the batch, naming its first
    launch, with nothing launched."""
    from hipr.backends._gpu_kernels import GpuKernels
    from hipr.handlers.module import _launch_each

    backend, gpu = native_sim

    def one_by_one(*_: Any) -> None:
        raise AssertionError("launched through the binding, one by one")

    monkeypatch.setattr(GpuKernels, "_issue", one_by_one)
    fill, n = _fill(backend), 4
    x, y = backend.malloc(4 * n), backend.malloc(4 * n)

    def name_of(index: int) -> str:
        return f"LAUNCH_KERNELS (launch {index + 1} of 4)"

    padded = _fill_args(y, 2.0, n) + b"\0" * 8
    launches = [(0, _fill_args(x, 1.0, n)), (1, padded), (3, _fill_args(x, 4.0, n))]
    before = len(gpu.launches)
    _launch_each(backend, (fill, (1, 1, 1), (32, 1, 1), 0, None), launches, name_of)
    sent = [args for _, args in gpu.launches[before:]]
    trimmed = _fill_args(y, 2.0, n) if backend.name == "cuda" else padded
    assert sent == [_fill_args(x, 1.0, n), trimmed, _fill_args(x, 4.0, n)]
    backend.synchronize()
    assert (_read(backend, x, n) == 4.0).all() and (_read(backend, y, n) == 2.0).all()
    if backend.name == "cuda":  # CUDA refuses arguments past the kernel's parameters
        junk = _fill_args(y, 3.0, n) + b"\1" + b"\0" * 7
        with pytest.raises(HipError, match=r"launch 2 of 4") as info:
            _launch_each(
                backend,
                (fill, (1, 1, 1), (32, 1, 1), 0, None),
                [(0, _fill_args(x, 5.0, n)), (1, junk), (2, _fill_args(x, 6.0, n))],
                name_of,
            )
        assert info.value.code == E.hipErrorLaunchOutOfResources
        backend.synchronize()
        assert (_read(backend, x, n) == 6.0).all()  # the one after it ran
    stream = backend.stream_create()
    backend.stream_destroy(stream)
    before = len(gpu.launches)
    with pytest.raises(HipError, match=r"launch 1 of 4") as info:
        _launch_each(backend, (fill, (1, 1, 1), (32, 1, 1), 0, stream), launches, name_of)
    assert info.value.code == E.hipErrorInvalidHandle
    assert len(gpu.launches) == before
