"""The status page shows each tenant's child worker (isolation = "process")."""

from __future__ import annotations

from rich.console import Console

from hipr.cli.status_view import render_status


def test_tenant_workers_table() -> None:
    status = {
        "backend": "emulator",
        "sessions": [{"id": "s1", "tenant": "alice", "memory": 1 << 20, "worker_pid": 4242}],
        "tenants": [{"name": "alice", "sessions": 1, "memory": 1 << 20}],
        "children": [
            {"tenant": "alice", "pid": 4242, "rss": 300 << 20, "sessions": 1, "memory": 1 << 20},
            {"tenant": "bob", "pid": 4343, "rss": 0, "sessions": 0, "memory": 0, "error": "gone"},
        ],
    }
    console = Console(width=140, record=True, highlight=False)
    console.print(render_status(status, "unix:///run/hipr/worker.sock"))
    text = console.export_text()
    assert "tenant workers" in text
    alice = next(line for line in text.splitlines() if "4242" in line and "alice" in line)
    assert "300.0 MiB" in alice and "1.0 MiB" in alice and "ok" in alice
    assert "not answering: gone" in text
