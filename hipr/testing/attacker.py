"""One attacker process that runs attack after attack of :data:`hipr.testing.hostile.ATTACKS`.

:class:`hipr.testing.hostile.ProcessAttack` starts a process per attack, as the
reliability report does (each attack against a fresh worker process). A test module
that runs a dozen attacks against in-process workers pays that start (a second of CPU
on a small machine, no part of any attack) a dozen times; :class:`AttackerProcess` pays
it once. Each attack still runs in a process apart from the worker, so its sockets and
sends never count against the worker, under an event loop of its own (``anyio.run``
per attack), and every attack closes what it opened before it returns its notes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from types import TracebackType
from typing import Any

import anyio
import anyio.to_thread

from hipr.testing.hostile import ATTACKS, Target

#: The child's line that carries an attack's notes (anything else it prints is passed over).
NOTES = "notes "
#: The child's first line, once it has imported what the attacks need.
READY = "ready"


class AttackerProcess:
    """A process that runs attacks by name on request, one at a time. Use it as a
    context manager (or :meth:`start` and :meth:`close`); :meth:`attack` runs one."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the process and wait until it is ready (it has imported the attacks)."""
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from hipr.testing.attacker import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if line.strip() != READY:
            self.close()
            raise RuntimeError(f"the attacker did not start: {line[:300]!r}")

    def run(self, name: str, target: Target) -> dict[str, Any]:
        """Attack ``name`` (a full name of ATTACKS) on ``target``; its notes, or
        ``{"error": ...}`` when the attack failed or the process is gone."""
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            return {"error": "the attacker is not started"}
        with self._lock:
            try:
                process.stdin.write(json.dumps({"name": name, "target": target.__dict__}) + "\n")
                process.stdin.flush()
            except OSError as exc:
                return {"error": f"the attacker is gone: {exc!r}"}
            for line in process.stdout:
                if line.startswith(NOTES):
                    return dict(json.loads(line[len(NOTES) :]))
        return {"error": f"the attacker ended with {process.wait()}"}

    async def attack(self, name: str, target: Target) -> dict[str, Any]:
        """:meth:`run` from an event loop (its blocking reads in a worker thread)."""
        return await anyio.to_thread.run_sync(self.run, name, target)

    def close(self) -> None:
        """End the process: its stdin closed (it returns), killed if it lingers."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            try:
                process.stdin.close()
            except OSError:
                pass
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> AttackerProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def serve() -> None:
    """The attacker process: say :data:`READY`, then for each JSON line on stdin
    (``{"name": ..., "target": {...}}``) run that attack and print its notes after
    :data:`NOTES`; returns at the end of stdin."""
    attacks = dict(ATTACKS)
    print(READY, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            notes = anyio.run(attacks[request["name"]], Target(**request["target"]))
        except Exception as exc:  # reported to the test, which fails on it
            notes = {"error": repr(exc)[:300]}
        print(NOTES + json.dumps(notes), flush=True)
