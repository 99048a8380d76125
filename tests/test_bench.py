"""The benchmark suite runs end to end and reports the right shape; nothing here times.

Every benchmark runs with tiny counts (``Plan.quick()``) against a real worker, over tcp
and unix, under trio and asyncio; the checks are on structure alone, never on a figure.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.bench import baselines, floors, results, servers, suite, syncbench
from hipr.cli import app as cli
from hipr.cli import bench
from hipr.protocol.opcodes import Opcode
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker

REPO = Path(__file__).resolve().parent.parent
PLAN = suite.Plan.quick()


def _short_dir(tag: str) -> Path:
    """A directory with a short path: unix socket paths must stay under 108 bytes."""
    return Path(tempfile.mkdtemp(prefix=f"hipr-bt-{tag}-", dir="/tmp"))


@pytest.fixture(params=["tcp", "unix"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def target(anyio_backend: str, transport: str) -> AsyncIterator[suite.Target]:
    """A worker and a baseline server on loopback, and the Target naming both."""
    short = _short_dir(anyio_backend)
    urls = {
        "tcp": ("tcp://127.0.0.1:0", "tcp://127.0.0.1:0"),
        "unix": (f"unix://{short}/w.sock", f"unix://{short}/b.sock"),
    }[transport]
    backend = EmulatorBackend(total_memory=64 << 20)
    local = baselines.local_runtime_copies(EmulatorBackend(), PLAN.copy_sizes, 1)
    async with (
        running_worker(WorkerConfig(max_frame_bytes=8 << 20), backend, [urls[0]]) as worker,
        anyio.create_task_group() as tg,
    ):
        (base_url,) = await tg.start(baselines.serve, [urls[1]])
        yield suite.Target(
            url=worker.bound_urls[0],
            baseline_url=base_url,
            transport=transport,
            loop=anyio_backend,
            worker_loop=anyio_backend,
            local_copies=tuple(local),
            local_malloc_seconds=0.001,
        )
        tg.cancel_scope.cancel()
    shutil.rmtree(short, ignore_errors=True)


def _check_row(row: suite.Row) -> None:
    assert row.bench in suite.BENCHMARKS
    assert row.name and row.unit in {"µs", "GB/s", "req/s", "ms"}
    assert isinstance(row.value, float) and math.isfinite(row.value) and row.value >= 0
    if row.baseline_value is not None:
        assert row.baseline and row.baseline_value >= 0
        assert row.ratio is None or row.ratio == row.value / row.baseline_value
    assert row.ratio_style in {"x", "%"}
    assert (row.met is None) == (row.goal == "")
    if row.local_value is not None:
        assert row.local and row.local_ratio == row.value / row.local_value
    json.dumps(row.to_json())


@pytest.mark.anyio
async def test_every_benchmark_runs_and_reports_its_shape(target: suite.Target) -> None:
    rows = await suite.run_suite(target, PLAN)
    for row in rows:
        _check_row(row)
    names = [row.name for row in rows]
    by_bench = {b: [r for r in rows if r.bench == b] for b in suite.BENCHMARKS}
    # 1. median and p99 of two null requests, the medians with the 1.5x goal
    assert [r.name for r in by_bench["rtt"]] == [
        "PING round trip, median",
        "PING round trip, p99",
        "get_device round trip, median",
        "get_device round trip, p99",
    ]
    assert [r.goal for r in by_bench["rtt"]] == ["≤ 1.5x", "", "≤ 1.5x", ""]
    # 2. both directions of every size, each beside the bare stream
    copies = by_bench["copy"]
    assert len(copies) == 2 * len(PLAN.copy_sizes)
    assert all(r.ratio_style == "%" and r.baseline.startswith("bare stream") for r in copies)
    assert "memcpy_htod 3.0 MiB" in names and "memcpy_dtoh 4 KiB" in names
    # 3. fire-and-forget beside the synchronous rate; 100k/s is a unix goal only
    ff = [r for r in by_bench["ff"] if "fire-and-forget" in r.name]
    assert len(ff) == 2 and all(r.unit == "req/s" and r.baseline_value for r in ff)
    assert all(("100k" in r.goal) == (target.transport == "unix") for r in ff)
    assert all(r.extra["posted_per_s"] > 0 for r in ff)
    # 4. malloc/free pairs, 5. many clients
    assert by_bench["malloc"][0].name == f"{PLAN.malloc_pairs} malloc/free pairs (4 KiB)"
    assert [r.unit for r in by_bench["concurrent"]] == ["req/s", "µs"]
    # 6. the same copies and malloc/free through the runtime, locally
    assert len(by_bench["local"]) == 2 * len(PLAN.copy_sizes) + 1


@pytest.mark.anyio
async def test_only_runs_the_benchmarks_named(target: suite.Target) -> None:
    rows = await suite.run_suite(target, PLAN.with_only(["rtt", "malloc"]))
    assert {row.bench for row in rows} == {"rtt", "malloc"}
    with pytest.raises(ValueError, match="unknown benchmark"):
        PLAN.with_only(["rtt", "nope"])


def test_local_runtime_copies_report_each_size() -> None:
    copies = baselines.local_runtime_copies(EmulatorBackend(), [4096, 1 << 20], 2)
    assert [c.size for c in copies] == [4096, 1 << 20]
    assert all(len(c.htod) == 2 and len(c.dtoh) == 2 for c in copies)
    assert baselines.local_malloc_free(EmulatorBackend(), 3) >= 0


def test_helpers() -> None:
    assert bench.parse_size("64M") == 64 << 20
    assert bench.parse_size("1GiB") == 1 << 30
    assert bench.parse_size("4096") == 4096
    assert bench.parse_size("1.5K") == 1536
    assert suite.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert suite.percentile(list(map(float, range(100))), 99) == 98.0
    assert suite.size_text(64 << 20) == "64 MiB" and suite.size_text(100) == "100 B"
    assert suite.frame_size(Opcode.PING) == 24


def test_tables_markdown_and_json_from_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        suite.Row(
            "rtt",
            "PING round trip, median",
            120.0,
            "µs",
            "bare echo",
            100.0,
            goal="≤ 1.5x",
            met=True,
        ),
        suite.Row(
            "copy",
            "memcpy_htod 64 MiB",
            1.0,
            "GB/s",
            "bare stream",
            2.0,
            ratio_style="%",
            goal="≥ 85 %",
            met=False,
            note="why",
        ),
    ]
    runs = [results.Run("unix", "trio", "trio", "unix:///x", "unix:///y", rows)]
    meta = {
        "date": "2026-11-23 00:00 UTC",
        "machine": results.machine_description(),
        "backend": "emulator",
        "device": "hipr emulator",
        "hipr_version": "0",
        "command": "hipr bench --local",
    }
    text = results.markdown(runs, meta)
    assert (
        "| PING round trip, median | 120.0 µs | bare echo | 100.0 µs | 1.20x | ≤ 1.5x | met |"
        in text
    )
    assert "| 50 % | ≥ 85 % | MISSED |" in text and "- memcpy_htod 64 MiB: why" in text
    written = results.write_split(str(tmp_path / "r-{transport}.md"), runs, lambda g: "x")
    assert [p.name for p in written] == ["r-unix.md"]
    results.print_tables(runs, meta)
    out = capsys.readouterr().out
    assert "1.20x" in out and "MISSED" in out and "goals met: 1 of 2" in out
    doc = results.results_json(runs, meta)
    assert doc["runs"][0]["rows"][1]["ratio"] == 0.5


def test_cli_needs_a_url_or_local(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench"]) == cli.EXIT_USAGE
    assert "needs a worker URL" in capsys.readouterr().err
    assert cli.main(["bench", "--local", "--only", "nope"]) == cli.EXIT_USAGE


def test_hipr_bench_local_is_one_command(tmp_path: Path) -> None:
    """``hipr bench --local`` starts its worker and baseline server, runs, and cleans up."""
    md = tmp_path / "out-{transport}.md"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hipr.cli.bench",
            "--local",
            "--quick",
            "--json",
            "--loop",
            "asyncio",
            "--markdown",
            str(md),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["meta"]["backend"] == "emulator" and doc["meta"]["machine"]["cpus"]
    blocking_worker = servers.default_worker_loop()
    assert [(r["transport"], r["loop"], r["worker_loop"]) for r in doc["runs"]] == [
        ("tcp", "blocking", blocking_worker),
        ("unix", "blocking", blocking_worker),
        ("tcp", "asyncio", "asyncio"),
        ("unix", "asyncio", "asyncio"),
    ]
    for transport in ("tcp", "unix"):
        runs = [r for r in doc["runs"] if r["transport"] == transport]
        assert {row["bench"] for run in runs for row in run["rows"]} == set(suite.BENCHMARKS)
        assert {row["bench"] for row in runs[0]["rows"]} == set(suite.BLOCKING_BENCHMARKS)
    assert (tmp_path / "out-tcp.md").read_text().startswith("# hipr bench: emulator, tcp")
    assert (tmp_path / "out-unix.md").is_file()


# --- issue 13: floors, the sync client's workloads, the local runtime -----------------


def test_the_floor_servers_ring_carries_every_byte() -> None:
    """A stream along the server's ring (the ring floor) moves the bytes promised, the
    ring's wrap included, and the connection serves the next command after it."""
    short = _short_dir("fr")
    try:
        (url,) = floors.serve_blocking([f"unix://{short}/r.sock"])
        with floors.FloorClient(url) as client:
            size = 3 * floors.PIECE + 5
            data = memoryview(bytearray(b"\3") * size)
            assert client.push(data, ring=2 * floors.PIECE + 1) > 0
            back = memoryview(bytearray(size))
            assert client.pull(back, ring=2 * floors.PIECE + 1) > 0
            # The ring (kept by the connection) holds what the push left, sent round it.
            assert back.tobytes() == b"\3" * size
            assert len(client.echo(3)) == 3
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_floor_server_answers_echo_stream_and_messages() -> None:
    """The blocking floor server, served from threads here (the bench runs it in a
    process of its own): every command answers with the bytes it promises."""
    short = _short_dir("fl")
    try:
        urls = floors.serve_blocking(["tcp://127.0.0.1:0", f"unix://{short}/f.sock"])
        assert urls[0].startswith("tcp://127.0.0.1:") and not urls[0].endswith(":0")
        for url in urls:
            result = floors.measure_floors(
                "x",
                url,
                echo_count=5,
                warmup=2,
                stream_size=(1 << 20) + 3,
                stream_repeats=2,
                message_sizes=(60, 112),
                message_count=7,
            )
            assert len(result.echo) == 5 and len(result.push) == len(result.pull) == 2
            assert result.gbs("push") > 0 and result.gbs("pull") > 0
            # The ring floor: the same streams along the server's ring.
            assert len(result.push_ring) == len(result.pull_ring) == 2
            assert result.gbs("push_ring") > 0 and result.gbs("pull_ring") > 0
            assert set(result.message_seconds) == {60, 112}
            assert result.echo_median > 0 and not result.uvloop_echo
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_local_work_on_the_emulator() -> None:
    work = floors.local_work(
        EmulatorBackend(total_memory=64 << 20),
        count=3,
        warmup=1,
        batch=4,
        batch_repeats=2,
        copy_size=1 << 20,
        copy_repeats=2,
        sgemm_n=32,
        sgemm_runs=1,
    )
    assert work.backend == "emulator"
    assert len(work.sync) == len(work.launch_sync) == 3 and len(work.per_launch) == 2
    assert len(work.htod) == len(work.dtoh) == 2 and work.copy_size == 1 << 20
    assert work.sgemm == []  # the emulator cannot compile; the sync rows say so


def test_sgemm_check_and_frame_sizes() -> None:
    a, b = floors.sgemm_inputs(32)
    assert floors.sgemm_check(a, b, a @ b) < 1e-5
    assert floors.sgemm_check(a, b, a @ b + 1) > 1e-3
    assert "__global__ void sgemm(const float* A, const float* B, float* C, int N)" in (
        floors.SGEMM_SOURCE
    )
    launch, copy = syncbench.message_sizes()
    assert launch > copy > 24


def test_markdown_shows_local_columns_only_where_a_row_has_one() -> None:
    rows = [
        suite.Row("floor", "blocking echo 24/32 B, median", 10.0, "µs"),
        suite.Row(
            "sync",
            "1-thread launch + synchronize, median",
            40.0,
            "µs",
            "blocking echo 24/32 B, median",
            10.0,
            goal="≤ 50 µs",
            met=True,
            local="local cuda",
            local_value=20.0,
        ),
    ]
    runs = [results.Run("unix", results.BLOCKING, "uvloop", "unix:///x", "unix:///f", rows, ["n"])]
    meta = {
        "date": "2026-11-23 00:00 UTC",
        "machine": results.machine_description(),
        "backend": "cuda",
        "hipr_version": "0",
        "command": "hipr bench --local",
    }
    text = results.markdown(runs, meta)
    assert "## unix, sync client (blocking sockets), worker uvloop: unix:///x" in text
    assert "| ratio | local | vs local | goal | |" in text
    assert (
        "| 1-thread launch + synchronize, median | 40.0 µs | blocking echo 24/32 B, median | "
        "10.0 µs | 4.00x | 20.0 µs | 2.00x | ≤ 50 µs | met |" in text
    )
    assert "- n" in text
    assert results.results_json(runs, meta)["runs"][0]["rows"][1]["local_ratio"] == 2.0


def test_hipr_bench_floor_and_sync_rows(tmp_path: Path) -> None:
    """``--only floor,sync --quick`` on the emulator: every issue-13 row present, ratios
    to the floor and to local computed, SGEMM skipped with a note; no GPU needed."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hipr.cli.bench",
            "--local",
            "--quick",
            "--json",
            "--only",
            "floor,sync",
            "--transport",
            "unix",
            "--save-json",
            str(tmp_path / "s-{transport}.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "hipr bench: floors over unix" in proc.stderr  # progress, on stderr
    doc = json.loads(proc.stdout)
    (run,) = doc["runs"]
    assert (run["transport"], run["loop"]) == ("unix", "blocking")
    rows = {row["name"]: row for row in run["rows"]}
    batch = f"{PLAN.launch_batch:,} launches then synchronize, per launch"
    sync_names = [
        "synchronize() on an idle device, median",
        "synchronize() on an idle device, p99",
        "1-thread launch + synchronize, median",
        "1-thread launch + synchronize, p99",
        batch,
        "memcpy_htod_async 4 B, fire-and-forget, then synchronize",
        "memcpy_htod_async 4 B on a stream, fire-and-forget, then synchronize",
        "memcpy_htod_async 4 B to 1,024 words in turn, fire-and-forget, then synchronize",
        "memcpy_htod_async 4 B on a stream to 1,024 words in turn, fire-and-forget, then "
        "synchronize",
        "memcpy_htod 1.0 MiB from a numpy array",
        "memcpy_dtoh 1.0 MiB into a numpy out",
    ]
    assert [r["name"] for r in run["rows"] if r["bench"] == "sync"] == sync_names
    for name in sync_names:
        assert rows[name]["ratio"] is not None and rows[name]["ratio"] > 0, name
    for name in (sync_names[0], sync_names[2], batch, *sync_names[9:]):
        assert rows[name]["local_ratio"] is not None and rows[name]["local"], name
    assert [rows[n]["goal"] for n in sync_names] == [
        "≤ 3x echo",
        "",
        "≤ 50 µs",
        "",
        "≤ 10 µs",
        "≥ 100k/s",
        "≥ 100k/s",
        "≥ 100k/s",
        "≥ 100k/s",
        "≥ 85 %",
        "≥ 85 %",
    ]
    floor_names = [r["name"] for r in run["rows"] if r["bench"] == "floor"]
    assert floor_names[:4] == [
        "blocking echo 24/32 B, median",
        "blocking echo 24/32 B, p99",
        "blocking stream send 1.0 MiB",
        "blocking stream receive 1.0 MiB (into the array)",
    ]
    assert "local emulator: 1-thread launch + synchronize, median" in floor_names
    if servers.default_worker_loop() == "uvloop":
        assert rows["uvloop echo 24/32 B, median"]["ratio"] > 0
    assert any("SGEMM" in note and "emulator" in note for note in run["notes"])
    assert json.loads((tmp_path / "s-unix.json").read_text())["runs"][0]["rows"]


def test_stage_trace_reports_every_stage() -> None:
    """``python -m benchmarks.stages`` against an instrumented emulator worker: every
    stage of every request kind is reported (shape only, never a figure)."""
    from benchmarks import stages

    lines: list[str] = []
    results = stages.measure("emulator", count=40, loop="asyncio", out=lines.append, long_rounds=20)
    assert len(results) == 7
    cpu = ["worker CPU per request", "client CPU per request"]
    *plain, launch_sync, forecast, no_forecast = results.values()
    titles = list(results)
    assert "forecast (client spin" in titles[-2] and "no forecast (client spin" in titles[-1]
    for long_kernel in (forecast, no_forecast):
        # Empty where every synchronize found the kernel done (a fast machine): shape only.
        expected = [*stages.LONG_STAGES, stages.LONG_CLIENT_CPU]
        assert not long_kernel or list(long_kernel) == expected
        assert all(value > 0 for value in long_kernel.get("total", []))
    del results[titles[-1]], results[titles[-2]]
    for per_stage in plain:
        assert list(per_stage) == [*stages.STAGES, *cpu]
    # Every pair had all its points (the emulator's launches run inline), and the
    # runtime's launch call was timed apart.
    assert list(launch_sync) == [*stages.LAUNCH_STAGES, stages.BACKEND_LAUNCH, *cpu]
    for per_stage in results.values():
        assert all(len(per_stage[name]) == 36 for name in per_stage if name not in cpu)
        assert all(value > 0 for value in per_stage["total"])
        assert all(per_stage[name][0] >= 0 for name in cpu)  # whole clock ticks: may be 0
    assert sum("median" in line for line in lines) == 4 * len(stages.STAGES) + len(
        stages.LAUNCH_STAGES
    ) + 1 + (len(stages.LONG_STAGES) + 1) * sum(bool(rows) for rows in (forecast, no_forecast))


def test_stage_trace_on_one_cpu_gives_the_cpus_back(capsys: pytest.CaptureFixture[str]) -> None:
    """``--cpu N`` runs both ends on CPU N, and this process has all its CPUs again after."""
    from benchmarks import stages

    allowed = os.sched_getaffinity(0)
    argv = ["--count", "40", "--loop", "asyncio", "--cpu", str(min(allowed)), "--long", "0"]
    assert stages.main(argv) == 0
    assert os.sched_getaffinity(0) == allowed
    assert "hipr.connect(): 1-thread launch + synchronize()" in capsys.readouterr().out


def test_stage_trace_runs_a_spinning_worker(capsys: pytest.CaptureFixture[str]) -> None:
    """``--worker-spin-wait S`` gives the instrumented worker that ``spin_wait`` (its
    config file), and every row is still measured."""
    from benchmarks import stages

    argv = ["--count", "40", "--loop", "asyncio", "--long", "0", "--worker-spin-wait", "0.0005"]
    assert stages.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("total") == 5
    worker = stages._Worker("emulator", "asyncio", 0.0005)
    try:
        config = Path(worker.dump).parent / "worker.toml"
        assert tomllib.loads(config.read_text()) == {"spin_wait": 0.0005}
        assert "--config" in worker.process.args
    finally:
        worker.stop()


def test_bulk_tool_compares_workers_round_by_round() -> None:
    """``python -m benchmarks.bulk`` with two emulator workers of different configs:
    every figure for each (shape only, never a figure's size), and a setting that
    the worker refuses stops the tool instead of being measured as a default."""
    from benchmarks import bulk

    lines: list[str] = []
    workers = [("one", {}), ("two", {"pinned_payload_bytes": "0"})]
    results = bulk.measure("emulator", "unix", 1 << 20, 2, workers, out=lines.append)
    assert list(results) == ["one", "two"]
    for figures in results.values():
        assert [key.split(" ", 1)[1] for key in figures] == [
            "GB/s",
            "loop thread CPU s/GiB",
            "other threads CPU s/GiB",
        ] * 2
        assert figures["htod GB/s"] > 0 and figures["dtoh GB/s"] > 0
        assert all(value >= 0 for value in figures.values())
    assert len(lines) == 2 + 6
    # The setting reaches the worker: one it refuses stops the worker before it listens.
    with pytest.raises(RuntimeError, match="exited before listening"):
        bulk.measure("emulator", "tcp", 1 << 20, 1, [("bad", {"pinned_payload_bytes": "-1"})])


def test_worker_settings_read_as_the_worker_toml_would() -> None:
    """``--serve-worker --set KEY=VALUE`` (and ``benchmarks.bulk``'s pairs): numbers and
    booleans as TOML reads them, anything else as text; a pair without ``=`` refused."""
    import argparse

    assert servers.worker_setting("spin_wait=0.005") == ("spin_wait", 0.005)
    assert servers.worker_setting(" pinned_payload_bytes = 64MiB ") == (
        "pinned_payload_bytes",
        "64MiB",
    )
    assert servers.worker_setting("isolation=true") == ("isolation", True)
    for wrong in ("spin_wait", "=1"):
        with pytest.raises(argparse.ArgumentTypeError):
            servers.worker_setting(wrong)


def test_spin_settings_take_seconds_or_auto() -> None:
    """``--worker-spin-wait`` and ``--serve-worker --spin-wait``: seconds, or ``auto``
    (None: the worker's own automatic window)."""
    import argparse

    assert servers.spin_setting("0.005") == 0.005
    assert servers.spin_setting(" AUTO ") is None
    with pytest.raises(argparse.ArgumentTypeError, match="auto"):
        servers.spin_setting("fast")


def test_copy_memory_reports_every_figure() -> None:
    """``python -m benchmarks.copy_memory`` with two clients for a moment: every figure
    is there and the worker held more under load than at start (shape, not a bound)."""
    from benchmarks import copy_memory

    figures = copy_memory.measure(clients=2, seconds=0.5, loop="asyncio")
    assert set(figures) == {"start", "peak", "end", "idle"}
    assert all(value > 0 for value in figures.values())
    assert figures["peak"] >= figures["start"]


def test_interleaved_ab_reports_every_workload_for_every_worker() -> None:
    """``python -m benchmarks.interleaved`` with two emulator workers (one spinning) for
    one round: every workload has a figure for each, in rounds that alternate."""
    from benchmarks import interleaved

    specs = [
        interleaved.WorkerSpec.parse("plain"),
        interleaved.WorkerSpec.parse(f"spinning:spin_wait=0.001,loop=asyncio,tree={REPO}"),
    ]
    assert specs[1].spin_wait == 0.001 and specs[1].tree == REPO
    timings = interleaved.measure(specs, rounds=1)
    assert timings.rounds == 1
    for workload in interleaved.WORKLOADS:
        assert set(timings.seconds[workload]) == {"plain", "spinning"}
        assert all(len(v) == 1 and v[0] > 0 for v in timings.seconds[workload].values())
    lines = interleaved.report(timings, ["plain", "spinning"])
    assert len(lines) == 2 + 2 * len(interleaved.WORKLOADS)


@pytest.mark.parametrize(
    ("text", "problem"),
    [(":spin_wait=1", "no name"), ("a:spin_wait", "key=value"), ("a:color=red", "unknown key"),
     ("a:tree=/nonexistent", "no hipr package")],
)  # fmt: skip
def test_interleaved_worker_specs_are_checked(text: str, problem: str) -> None:
    from benchmarks import interleaved

    with pytest.raises(ValueError, match=problem):
        interleaved.WorkerSpec.parse(text)


@pytest.mark.timeout(60)
def test_launch_pieces_report_every_piece() -> None:
    """benchmarks.pieces: every figure present and positive, the second-thread rows at
    every switch interval, and the interval put back afterwards."""
    from benchmarks import pieces

    saved = sys.getswitchinterval()
    figures = pieces.wire_pieces(50)
    figures.update(pieces.backend_pieces("emulator", 50))
    assert sys.getswitchinterval() == saved
    assert len([name for name in figures if name.startswith("second thread")]) == 1 + len(
        pieces.SWITCH_INTERVALS
    )
    assert "backend launch, this thread" in figures
    assert all(value > 0 for value in figures.values()), figures
