"""Logs: repeated errors collapse with a count, levels per logger, and every line of a
session carries its tenant, session id and peer."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

import hipr
import hipr.observability.log as log_module
from hipr.backends.emulator import EmulatorBackend
from hipr.observability.log import (
    RATE_LIMIT_BURST,
    RateLimiter,
    configure_logging,
    get_logger,
    set_levels,
)
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker


@pytest.fixture(autouse=True)
def _restore_logging(logging_restored: None) -> Iterator[None]:
    yield
    if log_module._limiter is not None:
        log_module._limiter.close()
        log_module._limiter = None  # nothing pending may reach a later test's output
    set_levels("info", {})


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limited(window: float = 10.0) -> tuple[io.StringIO, Clock]:
    out = io.StringIO()
    configure_logging("debug", "json", out, rate_limit_window=window)
    clock = Clock()
    assert log_module._limiter is not None
    log_module._limiter.clock = clock
    return out, clock


def test_repeated_errors_collapse_into_a_count() -> None:
    out, clock = limited()
    log = get_logger("hipr.connection")
    for i in range(5):
        log.warning("protocol error", error="bad magic", peer=f"10.0.0.{i}")
        clock.now += 1
    log.warning("protocol error", error="frame too large")  # another error: not collapsed
    assert [r["error"] for r in lines(out)] == ["bad magic", "frame too large"]
    clock.now += 10
    log.info("something else")
    records = lines(out)[2:]
    assert records[0]["event"] == "suppressed 4 similar"
    assert records[0]["similar_to"] == "protocol error" and records[0]["error"] == "bad magic"
    assert records[0]["level"] == "warning" and records[0]["logger"] == "hipr.connection"
    assert records[1]["event"] == "something else"
    # The window is over: the next one is written again.
    log.warning("protocol error", error="bad magic")
    assert lines(out)[-1]["event"] == "protocol error"


def limited_now(window: float = 10.0) -> tuple[io.StringIO, Clock]:
    """As limited(), without the background writer (the fake clock drives everything)."""
    out = io.StringIO()
    configure_logging("debug", "json", out, rate_limit_window=window, background_summaries=False)
    clock = Clock()
    assert log_module._limiter is not None
    log_module._limiter.clock = clock
    return out, clock


def test_debug_is_never_limited_and_info_only_past_its_burst() -> None:
    out, _ = limited_now()
    log = get_logger("hipr.test")
    for _ in range(3):
        log.info("request", opcode="PING")
    for _ in range(50):
        log.debug("detail")
    assert len(lines(out)) == 53
    for _ in range(10):
        log.info("request", opcode="PING")
    assert len(lines(out)) == 53 + RATE_LIMIT_BURST - 3


def test_an_info_flood_is_one_summary_with_its_peers() -> None:
    """1,000 handshakes timing out write a handful of lines, not 1,000."""
    out, clock = limited_now()
    log = get_logger("hipr.connection")
    for i in range(1000):
        log.bind(peer=f"tcp 10.0.{i // 250}.{i % 250}:4000").info("handshake timed out")
    assert len(lines(out)) == RATE_LIMIT_BURST
    clock.now += 10
    log.info("listening")
    summary = lines(out)[RATE_LIMIT_BURST]
    assert summary["event"] == f"suppressed {1000 - RATE_LIMIT_BURST} similar"
    assert summary["similar_to"] == "handshake timed out" and summary["level"] == "info"
    assert summary["peers"] == [f"tcp 10.0.0.{i}:4000" for i in range(5, 10)]
    assert len(lines(out)) == RATE_LIMIT_BURST + 2


def test_errors_that_differ_in_their_numbers_are_one_error() -> None:
    """ "frame payload of N bytes is over the limit" carried its size: every size was a
    new line. Numbers no longer make an error new, and an event is limited whatever
    its errors say."""
    out, clock = limited_now()
    log = get_logger("hipr.connection")
    for size in range(100):
        log.warning("protocol error", error=f"frame payload of {size} bytes is over the limit")
    assert len(lines(out)) == 1
    for i in range(100):
        log.warning("protocol error", error=f"bad magic {chr(65 + i % 26) * (i + 1)!r}")
    assert len(lines(out)) == RATE_LIMIT_BURST
    clock.now += 10
    log.info("next")
    summaries = [r for r in lines(out) if r["event"].startswith("suppressed")]
    assert sum(int(r["event"].split()[1]) for r in summaries) == 200 - RATE_LIMIT_BURST
    assert any(len(r.get("errors", ())) == 5 for r in summaries)


def test_stdlib_records_are_limited_too() -> None:
    out, clock = limited_now()
    foreign = logging.getLogger("asyncio")
    for i in range(200):
        foreign.error("socket.accept() out of system resource\nsocket: %s", i)
    assert len(lines(out)) == 1  # one error, repeated: collapsed from the first
    clock.now += 10
    get_logger("hipr.test").info("next")
    summary = lines(out)[1]
    assert summary["event"] == "suppressed 199 similar" and summary["logger"] == "asyncio"


def test_summaries_come_on_time_without_another_line() -> None:
    """The flood stops: its summary is still written when the window ends."""
    out = io.StringIO()
    configure_logging("info", "json", out, rate_limit_window=0.2)
    log = get_logger("hipr.connection")
    for i in range(50):
        log.bind(peer=f"tcp 10.0.0.{i}:1").warning("handshake refused", error="wrong token")
    assert len(lines(out)) == 1
    deadline = time.monotonic() + 5
    while len(lines(out)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    summary = lines(out)[1]
    assert summary["event"] == "suppressed 49 similar" and len(summary["peers"]) == 5


def test_exceptions_are_keyed_by_their_error() -> None:
    out, _ = limited()
    log = get_logger("hipr.test")
    for message in ("a", "a", "b"):
        try:
            raise ValueError(message)
        except ValueError:
            log.exception("handler failed")
    assert len(lines(out)) == 2


def test_flush_reports_what_is_pending() -> None:
    out, _ = limited()
    log = get_logger("hipr.test")
    for _ in range(3):
        log.error("backend unavailable", error="no device")
    assert log_module._limiter is not None
    log_module._limiter.flush()
    assert lines(out)[-1]["event"] == "suppressed 2 similar"
    assert lines(out)[-1]["level"] == "error"
    log_module._limiter.flush()
    assert len(lines(out)) == 2


def test_a_zero_window_limits_nothing() -> None:
    out, _ = limited(window=0)
    for _ in range(3):
        get_logger("hipr.test").error("same")
    assert len(lines(out)) == 3


def test_limiter_state_stays_bounded() -> None:
    limiter = RateLimiter(10.0, clock=lambda: 0.0, max_keys=8)
    for i in range(100):
        limiter(None, "warning", {"event": f"e{i}", "level": "warning", "logger": "x"})
    assert len(limiter._windows) <= 8


def test_levels_per_logger() -> None:
    out = io.StringIO()
    configure_logging("info", "json", out, levels={"hipr.connection": "debug"})
    get_logger("hipr.connection").debug("shown")
    get_logger("hipr.connection.child").debug("shown too")
    get_logger("hipr.session").debug("hidden")
    assert [r["event"] for r in lines(out)] == ["shown", "shown too"]
    # Reconfigured without it, the logger follows the root level again.
    out = io.StringIO()
    configure_logging("info", "json", out, levels={"hipr.transports": "error"})
    get_logger("hipr.connection").debug("hidden")
    get_logger("hipr.transports").warning("hidden")
    get_logger("hipr.transports").error("shown")
    assert [r["event"] for r in lines(out)] == ["shown"]


def test_bad_level_in_levels_is_refused_before_anything_changes() -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("info", "json", io.StringIO(), levels={"hipr": "loud"})


@pytest.mark.anyio
async def test_session_lines_carry_tenant_session_and_peer(anyio_backend: str) -> None:
    out = io.StringIO()
    configure_logging("debug", "json", out)
    backend = EmulatorBackend(device_count=1, total_memory=64 << 20)
    async with (
        running_worker(WorkerConfig(), backend, ["tcp://127.0.0.1:0"]) as worker,
        hipr.aconnect(worker.bound_urls[0]) as gpu,
    ):
        session_id = gpu.session_id
    records = [r for r in lines(out) if r.get("session") == session_id]
    events = {r["event"] for r in records}
    assert {"session started", "session ended"} <= events
    for record in records:
        assert record["tenant"] == "anonymous", record
        assert record["peer"].startswith("tcp 127.0.0.1:"), record
