"""Hostile clients on loopback: each attack of issue 29's table against a worker with
two tenants, and the bounds it must keep: the worker's RSS, the other tenant's calls
against its own baseline measured in the same test, log lines written, counters moved.

The worker runs in this process (its RSS is this process's) and each attack in a
process apart from it, as attackers are: their sockets and Python work must not be
counted against the worker. One attacker process serves the module's attacks, one
after the other (``hipr.testing.attacker``): a Python start per attack cost a second
each, no part of the attack. Handshake and frame timeouts are short, so that every
test takes seconds. The idle-connection test opens 300 connections here (``scripts/reliability-
report --hostile`` opens 1,000 against a worker process).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import anyio
import pytest

from hipr.testing.attacker import AttackerProcess
from hipr.testing.harness import rss_bytes
from hipr.testing.hostile import ATTACKS, Outcome, measure
from tests.hostile.conftest import FRAME_TIMEOUT, HANDSHAKE_TIMEOUT, Hostile, settle_memory

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.alone]

MiB = 1 << 20
#: Lines of one event a window lets through, plus its summary and a few others.
HANDFUL = 12


def assert_unharmed(outcome: Outcome) -> None:
    """The other tenant notices little: its median and 90th percentile stay within a
    small factor of its own unloaded ones, and no call stalls as the loop froze before
    (seconds). The issue's 100 ms bound on the worst call is what
    ``scripts/reliability-report --hostile`` reports; here, on a 2-core machine that
    other test runs share with the attacker's process, a call may lose the CPU for a
    few hundred ms whatever the worker does, so the bound on it is looser."""
    loaded = sorted(outcome.loaded_ms)
    base = sorted(outcome.baseline_ms)
    p90, base_p90 = loaded[int(0.9 * (len(loaded) - 1))], base[int(0.9 * (len(base) - 1))]
    shown = (
        f"{outcome.name}: median {outcome.median_ms:.2f} ms (base "
        f"{outcome.baseline_median_ms:.2f}), p90 {p90:.1f} (base {base_p90:.1f}), worst "
        f"{outcome.worst_ms:.1f} ms (base {outcome.baseline_worst_ms:.1f}), "
        f"{len(loaded)} calls"
    )
    assert loaded, shown
    assert outcome.median_ms <= 5 * outcome.baseline_median_ms + 2, shown
    assert p90 <= 5 * base_p90 + 10, shown
    assert outcome.worst_ms <= outcome.baseline_worst_ms + 500, shown


@pytest.fixture(scope="module")
def attacker() -> Iterator[AttackerProcess]:
    """The process that runs this module's attacks (started once: see the module doc)."""
    with AttackerProcess() as process:
        yield process


async def run(hostile: Hostile, attacker: AttackerProcess, name: str) -> Outcome:
    """Attack ``name`` of ATTACKS (by a word of it), from the attacker's process."""
    (found,) = [full for full, _ in ATTACKS if name in full]
    settle_memory()
    return await measure(
        hostile.target,
        found,
        partial(attacker.attack, found, hostile.target),
        rss_bytes,
        baseline_calls=100,
        settle=0.2,
    )


async def test_hello_bombs_are_refused_from_their_header(
    hostile: Hostile, attacker: AttackerProcess
) -> None:
    """32 MiB of empty maps and 8 MiB of empty arrays in a HELLO, no token: refused
    before their payload is read. (Before: +2.4 GB and a 7.7 s freeze.)"""
    for name in ("HELLO bomb: 32 MiB", "HELLO bomb: 8 MiB"):
        outcome = await run(hostile, attacker, name)
        assert outcome.notes["closed"], outcome.notes
        assert outcome.rss_peak - outcome.rss_idle < 64 * MiB
        assert_unharmed(outcome)
    assert hostile.counter("frames_refused", reason="frame_size") == 2
    assert hostile.counter("protocol_errors", kind="protocol") == 2


async def test_hello_bombs_that_fit_are_decoded_within_bounds(
    hostile: Hostile, attacker: AttackerProcess
) -> None:
    """A HELLO exactly max_hello_bytes long, all empty maps, ten times: each decoded
    within the item bound, refused as a HELLO, the connection closed."""
    outcome = await run(hostile, attacker, "max_hello_bytes")
    assert outcome.notes["closed"] and outcome.notes["answer"], outcome.notes
    assert outcome.rss_peak - outcome.rss_idle < 64 * MiB
    assert_unharmed(outcome)


async def test_authenticated_bombs_cost_their_sender_the_connection(
    hostile: Hostile, attacker: AttackerProcess
) -> None:
    """Tenant alice's request of 8 MiB of empty arrays, then 32 MiB of empty maps: a
    clear error naming max_cbor_items, a closed connection; bob notices nothing."""
    for name in ("session bomb: 8 MiB", "session bomb: 32 MiB"):
        outcome = await run(hostile, attacker, name)
        assert outcome.notes["closed"], outcome.notes
        answer = outcome.notes["answer"]
        assert answer is None or "max_cbor_items" in answer, answer
        assert outcome.rss_peak - outcome.rss_idle < 64 * MiB
        assert_unharmed(outcome)
    assert hostile.counter("frames_refused", reason="cbor_items") == 2


async def test_unfinished_hellos_hold_little_memory(
    hostile: Hostile, attacker: AttackerProcess
) -> None:
    """20 connections announce a maximum-size HELLO (refused from the header), 20 more
    send all but the last byte of a max_hello_bytes one and wait: under 32 MiB in all,
    and every one closed by the handshake timeout. (Before: +1.3 GB.)"""
    started = anyio.current_time()
    outcome = await run(hostile, attacker, "unfinished")
    assert outcome.notes["closed"] == 40, outcome.notes
    assert outcome.rss_peak - outcome.rss_idle < 32 * MiB
    assert anyio.current_time() - started < HANDSHAKE_TIMEOUT + 10
    assert hostile.counter("frames_refused", reason="frame_size") == 20
    assert hostile.counter("handshake_timeouts") == 20
    assert_unharmed(outcome)


async def test_idle_connections_write_a_handful_of_lines(
    hostile: Hostile, attacker: AttackerProcess
) -> None:
    """300 connections that never say HELLO: closed at the handshake timeout, one
    counter, a handful of log lines (before: one line each)."""
    lines_before = len(hostile.log_lines())
    outcome = await run(hostile, attacker, "idle")
    assert outcome.notes["closed"] == outcome.notes["opened"] == 300, outcome.notes
    await anyio.sleep(0.1)
    assert hostile.counter("handshake_timeouts") == 300
    written = hostile.log_lines()[lines_before:]
    timed_out = [r for r in written if r["event"] == "handshake timed out"]
    assert len(timed_out) <= 5, len(timed_out)
    assert len(written) <= HANDFUL, [r["event"] for r in written]
    assert outcome.rss_peak - outcome.rss_idle < 64 * MiB
    assert_unharmed(outcome)


@pytest.mark.parametrize(
    "hostile",
    [{"max_pending_handshakes": 64, "max_pending_handshakes_per_peer": 32}],
    indirect=True,
)
async def test_pending_handshakes_over_the_caps_are_closed_at_once(
    hostile: Hostile, attacker: AttackerProcess
) -> None:
    """Over max_pending_handshakes_per_peer, connections from one source are closed as
    they come (counted); another source still connects, and bob's session goes on."""
    outcome = await run(hostile, attacker, "idle")
    assert outcome.notes["closed"] == 300
    refused = hostile.counter("preauth_refusals", reason="pending_handshakes_per_peer")
    timed_out = hostile.counter("handshake_timeouts")
    assert refused + timed_out == 300 and refused >= 100, (refused, timed_out)
    assert_unharmed(outcome)
    admission = hostile.worker.admission
    assert (admission.caps.total, admission.caps.per_source) == (64, 32)
    assert admission.peak_per_source == 32
    assert admission.pending == 0


async def test_a_log_flood_writes_a_handful_of_lines(
    hostile: Hostile, attacker: AttackerProcess
) -> None:
    """300 connections speaking HTTP: 300 protocol errors, each with its own text
    (before: one line each, never collapsed, as the sizes and paths differed)."""
    lines_before = len(hostile.log_lines())
    outcome = await run(hostile, attacker, "bad-magic")
    assert outcome.notes["connections"] == 300
    await anyio.sleep(0.1)
    written = hostile.log_lines()[lines_before:]
    assert len(written) <= HANDFUL, [r["event"] for r in written]
    assert hostile.counter("protocol_errors", kind="protocol") == 300
    assert_unharmed(outcome)


async def test_wrong_tokens_from_one_source_are_slowed(
    hostile: Hostile, attacker: AttackerProcess
) -> None:
    """Wrong tokens, 16 at a time from one source for 2 s: each refusal waits longer
    (exponentially, capped), so the source gets few tries; a wrong token from another
    source is answered at once; every failure is counted by source. (Before: 2,638
    tries a second.)"""
    outcome = await run(hostile, attacker, "wrong-token")
    notes = outcome.notes
    assert notes["attempts"] < 400, notes  # 16 parallel, most waiting out 2 s delays
    assert notes["slowest_s"] >= 1.0, notes
    assert notes["other_source_s"] < 0.5, notes
    assert hostile.counter("auth_failures", who="127.0.0.1") == notes["attempts"]
    assert hostile.counter("auth_failures", who="127.0.0.2") == 1
    assert hostile.worker.auth_backoff.level("127.0.0.2") <= 1.0
    assert_unharmed(outcome)


async def test_a_dripping_link_is_closed(hostile: Hostile, attacker: AttackerProcess) -> None:
    """An authenticated link that sends one byte of a frame every tenth of
    frame_timeout is never silent, yet closed once the frame is overdue."""
    outcome = await run(hostile, attacker, "drip")
    assert outcome.notes["closed"], outcome.notes
    assert outcome.notes["closed_after_s"] < FRAME_TIMEOUT + 3, outcome.notes
    assert hostile.counter("frames_refused", reason="frame_timeout") == 1
    assert_unharmed(outcome)


async def test_a_busy_session_hears_the_heartbeat_too(hostile: Hostile) -> None:
    """The worker PINGs every session each heartbeat_interval, not only silent ones:
    a link kept busy must still answer. Steady requests until two PINGs came (at
    heartbeat_interval 0.5 s: about a second), for at most 10 s."""
    from hipr.protocol import Flags, FrameDecoder, Opcode, encode_frame
    from hipr.testing.harness import RawClient

    client = await RawClient.open(hostile.target.url, hostile.target.bob)
    decoder = FrameDecoder()
    pings = 0
    try:
        with anyio.fail_after(20):
            deadline = anyio.current_time() + 10.0
            request_id = 100
            while pings < 2 and anyio.current_time() < deadline:
                request_id += 1
                await client.stream.send(
                    encode_frame(Opcode.MEM_GET_INFO, request_id, Flags.NONE, {})
                )
                answered = False
                while not answered:
                    decoder.feed(await client.stream.receive())
                    for frame in decoder.frames():
                        if frame.opcode == Opcode.PING and not frame.flags & Flags.REPLY:
                            pings += 1
                        answered |= frame.request_id == request_id
                await anyio.sleep(0.01)
    finally:
        await client.aclose()
    assert pings >= 2, pings  # heartbeat_interval 0.5 s, while requests never stopped
