"""A kernel that writes far past its allocation: the launch returns (it is queued,
fire-and-forget) and the fault comes back at the session's next synchronising call.

An illegal address poisons a CUDA context for good, so each case runs against a worker
process of its own (``worker_process``), never the module's shared worker, and creates
everything it needs before the faulting launch (after it, a CUDA context refuses even a
malloc).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import hipr
from hipr.errors import HipErrorCode as E
from tests.conformance.conftest import Target, WorkerProcess

#: Elements the kernel is told to fill: 256 GiB of float32 from a 4 KiB allocation.
FAR_TOO_MANY = np.uint64(1 << 36)

#: (gpu, stream or None, event, the allocation) -> a synchronising call.
SyncCall = Callable[[Any, Any, Any, Any], object]

SYNC_CALLS: dict[str, tuple[SyncCall, bool]] = {
    # name: (the synchronising call, whether the kernel runs on a created stream)
    "synchronize": (lambda gpu, s, e, p: gpu.synchronize(), False),
    "stream_synchronize": (lambda gpu, s, e, p: s.synchronize(), True),
    "event_synchronize": (lambda gpu, s, e, p: (e.record(s), e.synchronize()), True),
    "memcpy_dtoh": (lambda gpu, s, e, p: gpu.memcpy_dtoh(p, 16), False),
}


@pytest.mark.parametrize("sync_call", SYNC_CALLS)
def test_illegal_address_surfaces_at_next_sync(
    target: Target, worker_process: WorkerProcess, sync_call: str
) -> None:
    call, on_stream = SYNC_CALLS[sync_call]
    with hipr.connect(worker_process.url) as gpu:
        p = gpu.malloc(4096)
        fill = gpu.builtin("fill_f32")
        stream = gpu.stream_create() if on_stream else None
        event = gpu.event_create()
        # The worker checks that the pointer is inside the session's allocation; the
        # length is the kernel's business, as on any GPU.
        fill.launch(1024, 256, [p, np.float32(1.0), FAR_TOO_MANY], stream=stream)
        assert gpu.ping() > 0  # not synchronising: nothing is reported yet
        with pytest.raises(hipr.HipError) as info:
            call(gpu, stream, event, p)
        assert info.value.code == E.hipErrorIllegalAddress, info.value
        assert info.value.name == "hipErrorIllegalAddress"
