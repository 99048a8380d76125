"""Fair service's parts alone (``hipr.worker.fairness``, the rate bucket, the tenants
keys): slices, round-robin turns by tenant, frame charges, throttling, weights."""

from __future__ import annotations

import math
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from hipr.sessions.limits import DEFAULT_MAX_REQUEST_RATE, Quotas, TokenBucket
from hipr.sessions.quotas import (
    THROTTLE_MAX_SECONDS,
    QuotaGate,
    TenantState,
    throttle_seconds,
)
from hipr.worker.config import ConfigError
from hipr.worker.fairness import FRAME_COST, SLICE_FRAMES, FairScheduler, frame_charge
from hipr.worker.tenants import load_tenants, new_token, token_hash


def test_every_frame_is_charged_at_least_frame_cost() -> None:
    assert frame_charge(0) == FRAME_COST
    assert frame_charge(24) == FRAME_COST
    assert frame_charge(FRAME_COST + 1) == FRAME_COST + 1
    assert frame_charge(64 << 20) == 64 << 20


def test_throttle_waits_for_a_refill_of_tens_of_milliseconds_at_most_a_second() -> None:
    # 2000/s: 10 ms of refill (20 requests), not one wake-up per token.
    assert throttle_seconds(2000, 1.0) == pytest.approx(0.01)
    # A bucket far in debt waits for the tokens it lacks, capped.
    assert throttle_seconds(2000, 100.0) == pytest.approx(0.05)
    assert throttle_seconds(0.1, 1.0) == THROTTLE_MAX_SECONDS
    assert throttle_seconds(0, 1.0) == THROTTLE_MAX_SECONDS


def test_a_slice_ends_after_its_frames_or_its_time() -> None:
    member = FairScheduler().member("alice")
    spent = [member.spent() for _ in range(SLICE_FRAMES + 1)]
    assert not any(spent[:-1]) and spent[-1]
    member.rested()
    assert not member.spent()
    member.limit_seconds = 0.001
    time.sleep(0.002)
    assert member.spent()  # the second request after a millisecond: over time


def test_weight_scales_the_slice() -> None:
    member = FairScheduler().member("alice")
    member.weigh(2.0)
    assert member.limit_frames == 2 * SLICE_FRAMES
    member.weigh(0.001)
    assert member.limit_frames == 1


@pytest.mark.anyio
async def test_a_lone_heavy_connection_only_yields() -> None:
    scheduler = FairScheduler()
    member = scheduler.member("alice")
    with anyio.fail_after(2):
        for _ in range(10):
            await member.next_turn()
    assert member.heavy and scheduler.heavy == 1
    assert scheduler.turns == 0  # nobody to take turns with: no hand-offs
    member.rested()
    assert not member.heavy and scheduler.heavy == 0


@pytest.mark.anyio
async def test_heavy_turns_go_round_robin_by_tenant_not_by_connection() -> None:
    """Alice floods on three connections, bob on one: while all four are heavy, bob
    gets every other turn (per connection he would get one in four)."""
    scheduler = FairScheduler()
    order: list[str] = []

    async def flood(tenant: str, turns: int) -> None:
        member = scheduler.member(tenant)
        for _ in range(turns):
            await member.next_turn()
            order.append(tenant)
        member.leave()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(flood, "alice", 40)
            tg.start_soon(flood, "bob", 20)
    assert scheduler.heavy == 0 and scheduler.waiting == 0
    # The first turns are taken as each connection first runs out; then strict turns.
    window = order[8:40]
    assert window.count("bob") >= len(window) // 2 - 2, order


@pytest.mark.anyio
async def test_a_waiting_connection_that_ends_leaves_the_turns_going() -> None:
    scheduler = FairScheduler()
    alice, bob, carol = (scheduler.member(name) for name in ("alice", "bob", "carol"))
    done: list[str] = []

    async def turns(member: object, name: str, count: int) -> None:
        assert hasattr(member, "next_turn")
        for _ in range(count):
            await member.next_turn()
        done.append(name)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as doomed:
                # bob is cancelled while he waits for a turn (or right after being woken).
                async with anyio.create_task_group() as inner:
                    inner.start_soon(turns, alice, "alice", 5)
                    inner.start_soon(turns, bob, "bob", 1000)
                    await anyio.lowlevel.checkpoint()
                    await anyio.lowlevel.checkpoint()
                    doomed.cancel()
            bob.leave()
            tg.start_soon(turns, alice, "alice", 20)
            tg.start_soon(turns, carol, "carol", 20)
    assert scheduler.waiting == 0
    assert done.count("carol") == 1 and "alice" in done


@pytest.mark.anyio
async def test_heavy_slices_leave_the_loop_idle_while_light_requests_arrive() -> None:
    scheduler = FairScheduler()
    member = scheduler.member("alice")
    member.spent()
    member.started -= 0.004  # a slice that took 4 ms of loop time
    member.limit_seconds = 0.004
    started = time.perf_counter()
    await member.next_turn()
    alone = time.perf_counter() - started
    member.spent()
    member.started -= 0.004
    scheduler.light_at = time.monotonic()  # bob's bytes just arrived
    started = time.perf_counter()
    await member.next_turn()
    shared = time.perf_counter() - started
    assert shared >= 0.003 > alone or alone < shared / 2, (alone, shared)


def test_default_rate_is_far_above_any_client_and_inf_lifts_it(tmp_path: Path) -> None:
    assert Quotas().max_request_rate == DEFAULT_MAX_REQUEST_RATE >= 1_000_000
    token = new_token()
    path = tmp_path / "tenants.toml"
    path.write_text(
        f'[tenants.free]\ntokens = ["{token_hash(token)}"]\nmax_request_rate = inf\n'
        f'weight = 2.5\n[tenants.plain]\ntokens = ["{token_hash(new_token())}"]\n'
    )
    registry = load_tenants(path)
    free, plain = registry.get("free"), registry.get("plain")
    assert free is not None and plain is not None
    assert free.quotas.max_request_rate == math.inf and free.quotas.weight == 2.5
    assert plain.quotas.max_request_rate == DEFAULT_MAX_REQUEST_RATE
    assert plain.quotas.weight == 1.0
    gate = QuotaGate("free", lambda: free.quotas, lambda: [], TenantState())
    assert all(gate.try_admit() for _ in range(10_000))
    assert gate.refill_seconds() == 0.0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("weight = 0", "positive"),
        ("weight = -1", "positive"),
        ("weight = inf", "finite"),
        ("weight = 1000", "at most 100"),
        ("weight = nan", "positive"),
        ('weight = "heavy"', "number"),
        ("max_request_rate = nan", "positive"),
        ("max_inflight_bytes = inf", "size"),
    ],
)
def test_bad_weights_and_rates_are_refused_naming_the_key(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(f'[tenants.a]\ntokens = ["{token_hash(new_token())}"]\n{line}\n')
    with pytest.raises(ConfigError, match=message) as raised:
        load_tenants(path)
    assert "tenants.a." + line.split(" ")[0] in str(raised.value)


def test_a_refunded_request_goes_back_in_the_bucket() -> None:
    quotas = Quotas(max_request_rate=1.0, max_request_burst=2.0)
    gate = QuotaGate("a", lambda: quotas, lambda: [], TenantState())
    assert gate.try_admit() and gate.try_admit()
    assert not gate.try_admit()
    assert gate.refill_seconds() > 0.5  # a token at 1/s is most of a second away
    gate.refund()
    assert gate.try_admit()
    assert not gate.try_admit()


def test_token_bucket_take_matches_take_up_to() -> None:
    one, many = TokenBucket(1000.0, 5.0), TokenBucket(1000.0, 5.0)
    assert [one.take() for _ in range(7)][:5] == [True] * 5
    assert many.take_up_to(7) == 5
    assert one.tokens() < 1.0 and many.tokens() < 1.0
    one.give_back(100)
    assert one.tokens() == 5.0  # never above the burst
