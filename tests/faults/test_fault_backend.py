"""The fault backend itself: deterministic, complete, and honest about what it injected."""

from __future__ import annotations

import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.backends.interface import Backend
from hipr.errors import HipError, HipErrorCode
from hipr.testing import BACKEND_METHODS, RELEASE_METHODS, FaultBackend, InjectedCrash


def _outcomes(backend: FaultBackend, calls: int) -> list[str]:
    seen = []
    for _ in range(calls):
        try:
            backend.device_count()
            seen.append("ok")
        except InjectedCrash:
            seen.append("crash")
        except HipError as exc:
            seen.append(exc.name)
    return seen


def test_it_wraps_every_backend_method() -> None:
    protocol = {
        name
        for name, value in vars(Backend).items()
        if callable(value) and not name.startswith("_") and name not in ("stats", "close")
    }
    assert set(BACKEND_METHODS) == protocol
    assert isinstance(FaultBackend(EmulatorBackend()), Backend)
    assert set(BACKEND_METHODS) >= RELEASE_METHODS


def test_the_same_seed_fails_the_same_calls() -> None:
    def run(seed: int) -> list[str]:
        return _outcomes(
            FaultBackend(EmulatorBackend(), seed=seed, probability=0.3, crash_share=0.3), 300
        )

    first, again, other = run(7), run(7), run(8)
    assert first == again
    assert first != other
    failures = sum(o != "ok" for o in first)
    assert 60 < failures < 120  # about 30 %
    assert "crash" in first and any(o.startswith("hipError") for o in first)


def test_counts_and_log_match_what_was_raised() -> None:
    backend = FaultBackend(EmulatorBackend(), probability=0.5, crash_share=0.5, seed=3)
    outcomes = _outcomes(backend, 200)
    failed = [o for o in outcomes if o != "ok"]
    assert backend.injected_count == len(failed) == len(backend.injected)
    assert backend.crash_count == outcomes.count("crash")
    assert backend.by_method == {"device_count": len(failed)}
    assert backend.calls("device_count") == 200


def test_scheduled_faults_pause_and_spare() -> None:
    inner = EmulatorBackend()
    backend = FaultBackend(inner, codes=[HipErrorCode.hipErrorOutOfMemory])
    ptr = backend.malloc(64)
    backend.fail_next("malloc", times=2)
    for _ in range(2):
        with pytest.raises(HipError) as info:
            backend.malloc(64)
        assert info.value.code == HipErrorCode.hipErrorOutOfMemory
    backend.malloc(64)
    backend.fail_next("free", crash=True)
    with backend.spare():
        backend.free(ptr)  # spared: the scheduled crash waits
    with pytest.raises(InjectedCrash):
        backend.free(ptr)
    backend.enabled = False
    backend.fail_next("malloc")
    backend.malloc(16)  # paused
    assert backend.stats() == inner.stats()
    assert backend.stats().allocations == 2


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        FaultBackend(EmulatorBackend(), probability=2.0)
    with pytest.raises(ValueError):
        FaultBackend(EmulatorBackend(), methods=["nope"])
    with pytest.raises(ValueError):
        FaultBackend(EmulatorBackend(), codes=[])
    with pytest.raises(ValueError):
        FaultBackend(EmulatorBackend()).fail_next("stats")
