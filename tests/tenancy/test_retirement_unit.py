"""hipr.worker.retirement on its own: one way a tenant child retires, with a reason that
its parent reads and counts (context lost: a reset; runaway: the stopped work)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from hipr.worker.config import WorkerConfig
from hipr.worker.isolation import TenantProcess, TenantProcesses
from hipr.worker.retirement import (
    CONTEXT_LOST,
    RUNAWAY,
    Retirement,
    record_path,
    retire_listeners,
    take_record,
)


class _Exited:
    """A child process that has exited (what the parent sees after a retirement)."""

    pid = 4242
    returncode = 75


def _listening(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    return sock


def test_a_retiring_child_leaves_its_reason_then_removes_its_socket(short_tmp: Path) -> None:
    path = short_tmp / "bob.1.sock"
    with _listening(path):
        retire_listeners(
            ["tcp://127.0.0.1:0", f"unix://{path}"],
            Retirement("bob", RUNAWAY, {"session": "s1"}),
        )
        assert not path.exists()
        # A second reason finds the socket gone: the first one stands.
        retire_listeners([f"unix://{path}"], Retirement("bob", CONTEXT_LOST))
    assert take_record(path) == Retirement("bob", RUNAWAY, {"session": "s1"})
    assert not record_path(path).exists()
    assert take_record(path) is None  # read once; a crash leaves none


def test_an_unreadable_record_is_dropped(short_tmp: Path) -> None:
    path = short_tmp / "bob.2.sock"
    record_path(path).write_text("{not json")
    assert take_record(path) is None
    assert not record_path(path).exists()


def test_the_parent_counts_each_retirement_by_its_reason(short_tmp: Path) -> None:
    told: list[Retirement] = []
    children = TenantProcesses(WorkerConfig(), base=short_tmp, on_retired=told.append)
    try:
        for number, reason in enumerate((CONTEXT_LOST, RUNAWAY, CONTEXT_LOST)):
            path = children.directory / f"bob.{number}.sock"
            with _listening(path):
                # The record names another tenant: the parent trusts only its own books.
                retire_listeners([f"unix://{path}"], Retirement("alice", reason, {"n": number}))
            process: Any = _Exited()
            children._children["bob"] = TenantProcess(
                "bob", process, f"unix://{path}", "t", key="bob"
            )
            children._reap()
            assert "bob" not in children._children
        # A child that died without a word (killed, crashed) is no retirement.
        process = _Exited()
        url = f"unix://{children.directory}/alice.9.sock"
        children._children["alice"] = TenantProcess("alice", process, url, "t", key="alice")
        children._reap()
        assert not children._children
        assert children.resets == {"bob": 2}
        assert children.retirements == {("bob", CONTEXT_LOST): 2, ("bob", RUNAWAY): 1}
        assert [(r.tenant, r.reason, r.details) for r in told] == [
            ("bob", CONTEXT_LOST, {"n": 0}),
            ("bob", RUNAWAY, {"n": 1}),
            ("bob", CONTEXT_LOST, {"n": 2}),
        ]
    finally:
        children._children.clear()
