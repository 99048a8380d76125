"""Where the facade connects: ``$HIPR_URL``/``$HIPR_TOKEN`` on the first call, one session
shared by every thread, ``hip.connect`` to choose; a lost worker is an error code."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from anyio.from_thread import start_blocking_portal

from hipr import hip
from hipr.client.link import LinkOptions
from hipr.facade import session
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker
from tests.facade.conftest import FacadeTarget, make_backend

pytestmark = pytest.mark.timeout(60)
OK = hip.hipError_t.hipSuccess
FAST = LinkOptions(
    heartbeat_interval=0.2,
    heartbeat_timeout=1.0,
    reconnect_delay=0.01,
    reconnect_max_delay=0.05,
    reconnect_timeout=1.0,
    reconnect_attempts=3,
    connect_timeout=2.0,
)


def test_first_call_connects_to_hipr_url(
    target: FacadeTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    hip.disconnect()
    monkeypatch.setenv("HIPR_URL", target.url)
    assert session.current() is None
    try:
        assert hip.hipGetDeviceCount()[0] is OK
        assert session.current() is not None
        # Every thread shares the one session, as the runtime's implicit context.
        ptr = hip.hipMalloc(64)[1]
        results: list[object] = []
        worker = threading.Thread(target=lambda: results.append(hip.hipMemset(ptr, 1, 64)))
        worker.start()
        worker.join(30)
        assert results == [(OK,)]
        assert hip.hipFree(ptr) == (OK,)
    finally:
        hip.disconnect()


def test_unreachable_worker_is_not_initialized(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hip.disconnect()
    monkeypatch.setenv("HIPR_URL", f"unix://{short_tmp}/nobody.sock")
    try:
        err, count = hip.hipGetDeviceCount()
        assert err is hip.hipError_t.hipErrorNotInitialized and count is None
        assert "nobody.sock" in hip.last_error_message()
    finally:
        hip.disconnect()


def test_lost_worker_is_an_error_code_not_a_traceback() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="hipr-l-", dir="/tmp"))
    backend = make_backend()
    try:
        with start_blocking_portal("trio") as portal:
            cm = portal.wrap_async_context_manager(
                running_worker(WorkerConfig(), backend, [f"unix://{tmp}/w.sock"])
            )
            worker = cm.__enter__()
            hip.connect(worker.bound_urls[0], link=FAST)
            ptr = hip.hipMalloc(64)[1]
            assert hip.hipMemset(ptr, 0, 64) == (OK,)
            cm.__exit__(None, None, None)
            err, free, _total = hip.hipMemGetInfo()
            assert err is not OK and isinstance(err, hip.hipError_t) and free is None
            assert hip.hipDeviceSynchronize()[0] is not OK
    finally:
        hip.disconnect()
        backend.close()
        shutil.rmtree(tmp, ignore_errors=True)
