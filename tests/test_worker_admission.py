"""Admission before authentication: caps on unfinished handshakes, the open-file limit
they follow, and the per-source backoff of refused HELLOs."""

from __future__ import annotations

import resource

import pytest

from hipr.worker.admission import (
    Admission,
    AuthBackoff,
    PendingCaps,
    open_file_limit,
    raise_open_file_limit,
    source_of,
)


def test_caps_follow_the_open_file_limit_unless_set() -> None:
    assert PendingCaps.derive(None, None, 1024) == PendingCaps(256, 32)
    assert PendingCaps.derive(None, None, 65536) == PendingCaps(16384, 2048)
    assert PendingCaps.derive(100, None, 65536) == PendingCaps(100, 32)
    assert PendingCaps.derive(10, 50, 65536) == PendingCaps(10, 10)  # never above the total
    assert PendingCaps.derive(None, None, 20) == PendingCaps(16, 16)


def test_admission_caps_in_all_and_per_source() -> None:
    admission = Admission(PendingCaps(total=3, per_source=2))
    first, second = admission.admit("10.0.0.1"), admission.admit("10.0.0.1")
    assert admission.admit("10.0.0.1") == "pending_handshakes_per_peer"
    third = admission.admit("10.0.0.2")
    assert admission.admit("10.0.0.3") == "pending_handshakes"
    assert not isinstance(first, str) and not isinstance(third, str)
    first.release()
    first.release()  # idempotent
    assert admission.pending == 2 and admission.pending_from("10.0.0.1") == 1
    assert not isinstance(admission.admit("10.0.0.3"), str)
    assert admission.peak_per_source == 2
    for ticket in (second, third):
        assert not isinstance(ticket, str)
        ticket.release()
    assert admission.pending_from("10.0.0.2") == 0


@pytest.mark.parametrize(
    ("peer", "source"),
    [
        ("tcp 10.0.0.2:50212", "10.0.0.2"),
        ("tcp [::1]:4000", "[::1]"),
        ("tls CN=alice 10.0.0.2:50212", "10.0.0.2"),
        ("unix uid=1000 pid=42", "unix uid=1000"),
        ("LoopSocketStream", "LoopSocketStream"),
    ],
)
def test_source_of_a_peer(peer: str, source: str) -> None:
    assert source_of(peer) == source


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_per_source_up_to_its_cap_and_decays() -> None:
    clock = Clock()
    backoff = AuthBackoff(0.05, 2.0, clock=clock)
    delays = [backoff.failed("10.0.0.1") for _ in range(8)]
    assert delays[:4] == pytest.approx([0.05, 0.1, 0.2, 0.4])
    assert delays[-1] == 2.0
    assert backoff.failed("10.0.0.2") == pytest.approx(0.05)  # other sources: not slowed
    clock.now += 60  # six half-lives quiet
    assert backoff.level("10.0.0.1") < 0.2
    assert backoff.failed("10.0.0.1") < 0.06


def test_backoff_state_stays_bounded() -> None:
    backoff = AuthBackoff(0.05, 2.0, clock=Clock(), max_sources=16)
    for i in range(1000):
        backoff.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(backoff._sources) == 16


def test_no_delay_when_disabled() -> None:
    backoff = AuthBackoff(0.0, 2.0)
    assert [backoff.failed("x") for _ in range(5)] == [0.0] * 5


def test_the_open_file_limit_is_raised_to_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard != resource.RLIM_INFINITY and hard > 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
            assert open_file_limit() == 64
        raised = raise_open_file_limit()
        assert raised == open_file_limit()
        assert hard == resource.RLIM_INFINITY or raised == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
