"""The instrumented worker of ``benchmarks.stages``, in a process of its own.

    python -m benchmarks.stage_worker DUMP worker [hipr worker's options...]

Runs ``hipr worker`` with timestamps (``time.perf_counter_ns``) taken where a request
is received, starts, is answered and its reply sent (the loop stream's
``data_received``, ``send`` and ``write_nowait``, the connection's executor and inline
answer, the GPU thread's waits and its own replies), and writes them to ``DUMP`` as
JSON on SIGUSR1; SIGUSR2 starts and stops a profile of the event-loop thread
(``DUMP.prof``). ``benchmarks.stages`` starts it and reads the marks back.
"""

from __future__ import annotations

import cProfile
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

#: The backend calls that wait for a kernel on the session's GPU thread.
_WAITING_CALLS = frozenset({"synchronize", "stream_synchronize", "event_synchronize"})


def serve(dump: str, worker_argv: list[str]) -> int:
    """The instrumented worker: record timestamps, write them to ``dump`` on SIGUSR1."""
    from hipr.protocol.header import Flags
    from hipr.sessions import gpu_thread
    from hipr.sessions import state as session
    from hipr.transports import loop_stream, thread_writes
    from hipr.worker import express, request_executor

    marks: dict[str, list[int]] = {"recv": [], "exec": [], "send0": [], "send1": []}
    #: Every request's start, as (time, opcode) pairs flattened: also fire-and-forget ones.
    starts: list[int] = []
    #: The end of each request answered in the I/O callback, flattened the same way.
    ends: list[int] = []
    #: When the worker saw each kernel done: a synchronize on a session's GPU thread
    #: returned, or the loop's polling (``spin_wait``) found the work finished.
    waited: list[int] = []
    #: When the I/O callback's look at a synchronize (``Session.work_done``) found the
    #: session's work finished.
    polled: list[int] = []
    #: Each inline backend ``launch`` call, as (start, end) pairs flattened: the runtime's
    #: own part of "launch starts -> launch issued".
    launch_calls: list[int] = []
    #: Each quick copy back tried on the loop (``memcpy_dtoh_if_quick``: the copy queued
    #: and its stream polled), as (start, end) pairs flattened.
    copy_calls: list[int] = []
    sends: list[tuple[int, int]] = []
    now = time.perf_counter_ns

    received = loop_stream._Protocol.data_received

    def data_received(self: Any, data: bytes) -> None:
        marks["recv"].append(now())
        received(self, data)

    execute = request_executor.RequestExecutor.execute

    async def timed_execute(self: Any, frame: Any) -> bool:
        started = now()
        marks["exec"].append(started)
        starts.extend((started, frame.opcode))
        return await execute(self, frame)

    answer_now = request_executor.RequestExecutor.answer_now

    def timed_answer_now(self: Any, frame: Any) -> bool:
        # A request answered in the I/O callback starts executing here; one handed to
        # the executor is marked there instead.
        started = now()
        answered = answer_now(self, frame)
        if answered:
            ends.extend((now(), frame.opcode))
            starts.extend((started, frame.opcode))
            if not frame.header.flags & Flags.NO_REPLY:
                marks["exec"].append(started)
        return answered

    express_answer = express.ExpressLaunch.answer

    def timed_express(self: Any, data: bytes) -> bool:
        # The express path (hipr.worker.express): a request answered there starts here.
        started = now()
        answered = express_answer(self, data)
        if answered:
            opcode = int.from_bytes(data[6:8], "little")
            ends.extend((now(), opcode))
            starts.extend((started, opcode))
            marks["exec"].append(started)
        return answered

    send = loop_stream.LoopSocketStream.send
    write_nowait = loop_stream.LoopSocketStream.write_nowait

    def timed_write_nowait(self: Any, data: bytes) -> None:
        started = now()
        write_nowait(self, data)
        sends.append((started, now()))

    async def timed_send(self: Any, item: bytes) -> None:
        started = now()
        await send(self, item)
        sends.append((started, now()))  # one entry per finished send: never half a pair

    thread_write = thread_writes.ThreadWrites.write

    def timed_thread_write(self: Any, data: bytes, busy: Any, queued: Any) -> bool:
        # A reply the session's GPU thread sent itself (answer_from_gpu_thread).
        started = now()
        sent = thread_write(self, data, busy, queued)
        if sent:
            sends.append((started, now()))
        return sent

    run_call = gpu_thread.GpuThread._run

    def timed_run(self: Any, item: Any) -> None:
        if getattr(item.fn, "__name__", "") not in _WAITING_CALLS:
            run_call(self, item)
            return
        then = item.then
        if then is None:
            run_call(self, item)
            waited.append(now())
            return

        def seen_done_then() -> object:
            # The wait returned: marked before the thread's own reply goes out.
            waited.append(now())
            return then()

        item.then = seen_done_then
        run_call(self, item)

    spin_until_done = session.Session.spin_until_done

    async def timed_spin(self: Any) -> bool:
        done = await spin_until_done(self)
        if done:
            waited.append(now())
        return done

    work_done = session.Session.work_done

    def timed_work_done(self: Any) -> bool:
        done = work_done(self)
        if done:
            polled.append(now())
        return done

    run_here = session.Session._run_here

    def timed_run_here(self: Any, fn: Any, *args: Any) -> Any:
        name = getattr(fn, "__name__", "")
        if name == "launch_waited":
            return _timed_launch_waited(self, fn, args)
        if name not in ("launch", "memcpy_dtoh_if_quick"):
            return run_here(self, fn, *args)
        started = now()
        try:
            return run_here(self, fn, *args)
        finally:
            (launch_calls if name == "launch" else copy_calls).extend((started, now()))

    def _timed_launch_waited(self: Any, fn: Any, args: tuple[Any, ...]) -> Any:
        """The native launch-and-wait: one call, split into the launch and the poll by the
        time the C side measured from the launch's return (``polled_ns``); a reply it
        sent is marked as sent when the call returned (its send is part of the poll)."""
        started = now()
        outcome = run_here(self, fn, *args)
        ended = now()
        if outcome is not None:  # None: no native call to be had, launched the usual way
            _mark_native(started, ended, self.backend._launch_wait.results(), outcome)
        return outcome

    launch_waited_again = session.Session.launch_waited_again

    def timed_launch_waited_again(self: Any, prepared: Any, fd: int, request_id: int) -> Any:
        """The express path's call packed once (``Session.launch_waited_again``), split
        as :func:`_timed_launch_waited` splits the native call."""
        started = now()
        outcome = launch_waited_again(self, prepared, fd, request_id)
        ended = now()
        if outcome is not None:
            _mark_native(started, ended, prepared.backend_call.call.results(), outcome)
        return outcome

    def _mark_native(started: int, ended: int, results: Any, outcome: Any) -> None:
        launch_calls.extend((started, ended - results.polled_ns))
        if outcome[0]:
            polled.append(ended)
        if outcome[2] > 0:  # the reply left from C right after the work was seen done
            sends.append((ended, ended))

    session.Session.work_done = timed_work_done  # type: ignore[method-assign]
    session.Session._run_here = timed_run_here  # type: ignore[method-assign]
    session.Session.launch_waited_again = timed_launch_waited_again  # type: ignore[method-assign]
    gpu_thread.GpuThread._run = timed_run  # type: ignore[method-assign]
    session.Session.spin_until_done = timed_spin  # type: ignore[method-assign]
    loop_stream._Protocol.data_received = data_received  # type: ignore[method-assign]
    request_executor.RequestExecutor.execute = timed_execute  # type: ignore[method-assign]
    request_executor.RequestExecutor.answer_now = timed_answer_now  # type: ignore[method-assign]
    express.ExpressLaunch.answer = timed_express  # type: ignore[method-assign]
    loop_stream.LoopSocketStream.send = timed_send  # type: ignore[method-assign]
    loop_stream.LoopSocketStream.write_nowait = timed_write_nowait  # type: ignore[method-assign]
    thread_writes.ThreadWrites.write = timed_thread_write  # type: ignore[method-assign]

    def write(*_: object) -> None:
        finished = list(sends)
        marks["send0"] = [a for a, _ in finished]
        marks["send1"] = [b for _, b in finished]
        marks["starts"] = list(starts)
        marks["ends"] = list(ends)
        marks["waited"] = list(waited)
        marks["polled"] = list(polled)
        marks["launch_calls"] = list(launch_calls)
        marks["copy_calls"] = list(copy_calls)
        Path(dump).write_text(json.dumps(marks))

    signal.signal(signal.SIGUSR1, write)
    profile = cProfile.Profile()
    profiling = False

    def toggle_profile(*_: object) -> None:
        # The handler runs on the main thread, the event loop's: the one profiled.
        nonlocal profiling
        if profiling:
            profile.disable()
            profile.dump_stats(f"{dump}.prof")
        else:
            profile.enable()
        profiling = not profiling

    signal.signal(signal.SIGUSR2, toggle_profile)
    from hipr.cli import main

    return main(worker_argv)


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], sys.argv[2:]))
