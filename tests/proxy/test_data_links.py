"""Data links (protocol 1.4) from the native proxy, under ASan/UBSan: core_check's uploads
of 40 MiB + 123 bytes (and smaller) go striped over the session's data links and read
back whole, over unix and tcp, in a forked child too (its own session and data links),
and the CUDA driver proxy's too; HIPR_DATA_LINKS=0, a worker that offers none and a
worker of protocol 1.3 get unstriped uploads; links cut under striped uploads (data links
or the main link) are reopened or resumed, and every byte lands; a data link that cannot
be replaced leaves its chunks to the others. The worker's metrics count the data links it
attached. The reads back of as many bytes (whole, unaligned, a range) go striped too
(downloads); a data link cut or gone silent under one, or a frame on it that is no chunk,
gets the read asked again unstriped, every byte right; a chunk of an earlier request is
dropped. HIPR_DATA_LINKS unset opens none on fewer than 4 CPUs."""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import cbor2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hipr.cpus import usable_cpus
from hipr.protocol.header import HEADER, MAGIC
from hipr.proxy.build import SANITIZE
from tests.proxy.conftest import stop_worker
from tests.proxy.sanitized import SANITIZER_ENV, assert_sanitizer_clean
from tests.proxy.test_core import (  # noqa: F401 - fixtures
    Program,
    Relay,
    Worker,
    _free_port,
    _start,
    end_pair,
    forward_plainly,
    program,
    short_dir,
)
from tests.proxy.test_cuda_c import _check_program
from tests.resilience.proxy import faulty_proxy

#: Below core_check's uploads (the smallest is 6 MiB + 1), above its 1 KiB ones.
STRIPE_MIN = str(4 << 20)
#: core_check striped's uploads: the parent's three, then its child's one.
UPLOADS = 4
#: core_check striped's reads: three after each upload (whole, unaligned, a range).
DOWNLOADS = 3 * UPLOADS
#: Data links a session opens by default (HIPR_DATA_LINKS and the worker's both 4).
LINKS = 4


def _debug_env(**more: str) -> dict[str, str]:
    """HIPR_DATA_LINKS set: by default a machine of fewer than 4 CPUs (CI's) opens none."""
    return {
        "HIPR_PROXY_DEBUG": "1",
        "HIPR_STRIPE_MIN_BYTES": STRIPE_MIN,
        "HIPR_DATA_LINKS": str(LINKS),
        **more,
    }


def _data_links(metrics: str) -> float:
    """Data links the worker attached, by its metrics (every tenant's)."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "hipr_data_links"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def _worker(directory: Path, extra: str = "") -> tuple[Worker, str]:
    metrics = f"127.0.0.1:{_free_port()}"
    return _start(directory, f'metrics_listen = "{metrics}"\n{extra}'), metrics


@pytest.fixture
def worker(short_dir: Path) -> Iterator[tuple[Worker, str]]:  # noqa: F811
    """A worker of default config (4 data links a session) and its metrics' address."""
    started, metrics = _worker(short_dir, "resume_grace = 30\n")
    try:
        yield started, metrics
    finally:
        stop_worker(started.process)


def _striped(result_stderr: str) -> int:
    return result_stderr.count("hipr proxy: striped upload of ")


def _striped_down(result_stderr: str) -> int:
    """Striped downloads asked (each one landed whole, or was asked again unstriped)."""
    return result_stderr.count("hipr proxy: striped download of ")


def _asked_again(result_stderr: str) -> int:
    return result_stderr.count("asked again unstriped")


def test_uploads_go_striped_over_unix_and_land_whole(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
) -> None:
    started, metrics = worker
    result = program.run(started.unix_url, "striped", env=_debug_env(), timeout=110)
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok striped resumes=0", result.stderr
    assert _striped(result.stderr) == UPLOADS, result.stderr
    # Every read back went striped too, and landed whole.
    assert _striped_down(result.stderr) == DOWNLOADS, result.stderr
    assert _asked_again(result.stderr) == 0, result.stderr
    assert "over 4 data links" in result.stderr
    # The parent's links survived its child: opened once in each process.
    assert result.stderr.count("hipr proxy: data link 0 open") == 2, result.stderr
    assert _data_links(metrics) == 2 * LINKS


def test_uploads_go_striped_over_tcp(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
) -> None:
    started, metrics = worker
    relay = Relay(started.unix_url.removeprefix("unix://"), [], [])
    try:
        result = program.run(
            f"tcp://127.0.0.1:{relay.port}", "striped", env=_debug_env(), timeout=110
        )
        assert_sanitizer_clean(result)
        assert result.stdout.strip() == "ok striped resumes=0", result.stderr
        assert _striped(result.stderr) == UPLOADS, result.stderr
        assert _striped_down(result.stderr) == DOWNLOADS, result.stderr
        assert _asked_again(result.stderr) == 0, result.stderr
        # A main link and 4 data links in the parent, and as many in its child.
        assert relay.links == 2 * (1 + LINKS)
        assert _data_links(metrics) == 2 * LINKS
    finally:
        relay.close()


def test_fewer_data_links_when_asked(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
) -> None:
    started, metrics = worker
    result = program.run(
        started.unix_url, "striped", env=_debug_env(HIPR_DATA_LINKS="2"), timeout=110
    )
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok striped resumes=0", result.stderr
    assert result.stderr.count("over 2 data links") == UPLOADS + DOWNLOADS, result.stderr
    assert _data_links(metrics) == 2 * 2


def test_no_data_links_with_hipr_data_links_0(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
) -> None:
    started, metrics = worker
    result = program.run(
        started.unix_url, "striped", env=_debug_env(HIPR_DATA_LINKS="0"), timeout=110
    )
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok striped resumes=0", result.stderr
    assert _striped(result.stderr) == 0 and "data link" not in result.stderr, result.stderr
    assert _data_links(metrics) == 0


def test_small_uploads_are_not_striped_by_default(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
) -> None:
    """16 MiB by default: only the two uploads of 40 MiB + 123 bytes go striped, and
    their reads."""
    started, metrics = worker
    env = {"HIPR_PROXY_DEBUG": "1", "HIPR_DATA_LINKS": str(LINKS)}
    result = program.run(started.unix_url, "striped", env=env, timeout=110)
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok striped resumes=0", result.stderr
    assert _striped(result.stderr) == 2, result.stderr
    assert _striped_down(result.stderr) == 2 * 3, result.stderr
    assert _data_links(metrics) == LINKS  # the child uploaded 9 MiB: no data link


def test_a_worker_that_offers_none_gets_unstriped_uploads(
    program: Program,  # noqa: F811
    short_dir: Path,  # noqa: F811
) -> None:
    started, metrics = _worker(short_dir, "data_links = 0\n")
    try:
        result = program.run(started.unix_url, "striped", env=_debug_env(), timeout=110)
        assert_sanitizer_clean(result)
        assert result.stdout.strip() == "ok striped resumes=0", result.stderr
        assert _striped(result.stderr) == 0 and "data link" not in result.stderr, result.stderr
        assert _data_links(metrics) == 0
    finally:
        stop_worker(started.process)


def test_a_worker_of_protocol_1_3_gets_unstriped_uploads(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
) -> None:
    started, metrics = worker
    relay = Relay(started.unix_url.removeprefix("unix://"), [], [], announce_minor=3)
    try:
        result = program.run(
            f"tcp://127.0.0.1:{relay.port}", "striped", env=_debug_env(), timeout=110
        )
        assert_sanitizer_clean(result)
        assert result.stdout.strip() == "ok striped resumes=0", result.stderr
        assert _striped(result.stderr) == 0, result.stderr
        assert _striped_down(result.stderr) == 0, result.stderr
        assert relay.links == 2  # the parent's session and its child's: no data link
        assert _data_links(metrics) == 0
    finally:
        relay.close()


@pytest.mark.parametrize(
    ("up_cuts", "down_cuts"),
    [
        # Inside the first upload's chunks (on a data link, or the main link's request),
        # and inside the last upload's.
        ([20_000_000, 90_000_000], []),
        # Inside the first download (most of whose bytes come on the data links): a
        # data link cut fails the striped read, which is asked again unstriped; the main
        # link cut is resumed.
        ([], [30_000_000]),
    ],
    ids=["up", "down"],
)
def test_links_cut_under_striped_uploads(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
    up_cuts: list[int],
    down_cuts: list[int],
) -> None:
    started, _ = worker
    relay = Relay(started.unix_url.removeprefix("unix://"), list(up_cuts), list(down_cuts))
    cuts = len(up_cuts) + len(down_cuts)
    try:
        result = program.run(
            f"tcp://127.0.0.1:{relay.port}", "striped", env=_debug_env(), timeout=110
        )
        assert_sanitizer_clean(result)
        assert result.stdout.startswith("ok striped resumes="), result.stderr
        assert relay.cuts == cuts, (relay.cuts, result.stderr)
        assert _striped(result.stderr) == UPLOADS, result.stderr
        assert _striped_down(result.stderr) == DOWNLOADS, result.stderr
        # Each cut ended a data link (reopened, or its read asked again unstriped) or
        # the main link (resumed).
        reopened = result.stderr.count("reopened")
        resumed = result.stderr.count("resumed the session")
        assert reopened + resumed + _asked_again(result.stderr) >= cuts, result.stderr
    finally:
        relay.close()


class RefusingRelay(Relay):
    """A relay that, once it cut a link, refuses the next ``refuse`` connections (closed
    at once, before any byte): a data link that cannot be replaced."""

    refuse: int = 3
    refused: int = 0

    def _admit(self) -> bool:
        if self.cuts and self.refused < self.refuse:
            self.refused += 1
            return False
        return True


def test_a_data_link_that_cannot_be_replaced_leaves_its_chunks_to_the_others(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
) -> None:
    started, _ = worker
    relay = RefusingRelay(started.unix_url.removeprefix("unix://"), [20_000_000], [])
    try:
        result = program.run(
            f"tcp://127.0.0.1:{relay.port}", "striped", env=_debug_env(), timeout=110
        )
        assert_sanitizer_clean(result)
        assert result.stdout.strip() == "ok striped resumes=0", result.stderr
        assert relay.cuts == 1 and relay.refused == 3, result.stderr
        assert result.stderr.count("cannot reopen") == 1, result.stderr
        assert _striped(result.stderr) == UPLOADS, result.stderr
    finally:
        relay.close()


def test_the_cuda_driver_proxy_stripes_too(
    sanitized_libs: Path, worker: tuple[Worker, str], tmp_path: Path
) -> None:
    """libcuda.so.1 holds a session core of its own: cuda_check's copy of 3 MiB + 4 KiB
    (cuMemcpyHtoD_v2) goes striped, and reads back whole."""
    started, metrics = worker
    checker = _check_program(sanitized_libs, tmp_path, SANITIZE)
    env = dict(os.environ, HIPR_URL=started.unix_url, **SANITIZER_ENV, **_debug_env())
    env["HIPR_STRIPE_MIN_BYTES"] = str(2 << 20)
    result = subprocess.run(
        [str(checker)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok", result.stderr
    assert _striped(result.stderr) >= 1, result.stderr
    # cuMemcpyDtoH_v2 of as many bytes: a striped read, landed whole.
    assert _striped_down(result.stderr) >= 1, result.stderr
    assert _asked_again(result.stderr) == 0, result.stderr
    assert _data_links(metrics) == LINKS


def test_a_worker_that_refuses_data_links_is_not_asked_again(
    program: Program,  # noqa: F811
    short_dir: Path,  # noqa: F811
) -> None:
    """A worker of `data_links = 0` made to offer 4 (the relay rewrites HELLO's reply):
    it refuses the first DATA_LINK (not supported), and the session asks no more; every
    upload goes unstriped and lands."""
    started, metrics = _worker(short_dir, "data_links = 0\n")
    relay = Relay(
        started.unix_url.removeprefix("unix://"),
        [],
        [],
        down_rewrites=[(b"jdata_links\x00", b"jdata_links\x04")],
    )
    try:
        result = program.run(
            f"tcp://127.0.0.1:{relay.port}", "striped", env=_debug_env(), timeout=110
        )
        assert_sanitizer_clean(result)
        assert result.stdout.strip() == "ok striped resumes=0", result.stderr
        assert _striped(result.stderr) == 0, result.stderr
        # Once in the parent, once in its child (a session of its own).
        assert result.stderr.count("the worker refused a data link") == 2, result.stderr
        assert relay.links == 2 * 2
        assert _data_links(metrics) == 0
    finally:
        relay.close()
        stop_worker(started.process)


#: The head of a MEMCPY_HTOD request as the proxy frames it (protocol 1.4).
HTOD_HEAD = b"HIPR\x04\x01\x10\x02"


class OneSideRelay(Relay):
    """A relay whose marks count (and cut) only one side's links: the session's main link
    (the first; its data links open after its HELLO) when ``marked_main``, else every
    other; the rest are forwarded as they are."""

    main: tuple[socket.socket, ...] | None = None
    marked_main = True

    def _pump(
        self, src: socket.socket, dst: socket.socket, up: bool, pair: tuple[socket.socket, ...]
    ) -> None:
        if self.main is None:
            self.main = pair
        if (pair is self.main) == self.marked_main:
            super()._pump(src, dst, up, pair)
            return
        forward_plainly(src, dst, pair)


class MainLinkRelay(OneSideRelay):
    """Marks on the main link only."""


def _recv(s: socket.socket) -> bytes:
    try:
        return s.recv(65536)
    except OSError:
        return b""


def _cut_inside_the_first(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
    head: bytes,
) -> subprocess.CompletedProcess[str]:
    """``core_check striped`` with its main link cut inside the first request that starts
    with ``head``. A first run finds where that request goes up the main link (every byte
    before it is the same from run to run: HELLO, the allocation); a second cuts there."""
    started, _ = worker
    target = started.unix_url.removeprefix("unix://")
    spy = MainLinkRelay(target, [], [], spy=bytearray())
    try:
        result = program.run(f"tcp://127.0.0.1:{spy.port}", "striped", env=_debug_env())
        assert_sanitizer_clean(result)
        assert spy.spy is not None
        at = bytes(spy.spy).find(head)
        assert at > 0
    finally:
        spy.close()
    relay = MainLinkRelay(target, [at + 10], [])
    try:
        result = program.run(
            f"tcp://127.0.0.1:{relay.port}", "striped", env=_debug_env(), timeout=110
        )
        assert_sanitizer_clean(result)
        assert relay.cuts == 1, result.stderr
        assert result.stdout.strip() == "ok striped resumes=1", result.stderr
        return result
    finally:
        relay.close()


def test_the_main_link_cut_inside_a_striped_request_is_resumed(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
) -> None:
    """The main link cut inside the first striped MEMCPY_HTOD request: the chunks go on
    meanwhile, the caller resumes the session, the worker replays the request and takes
    the chunks it held for it."""
    result = _cut_inside_the_first(program, worker, HTOD_HEAD)
    assert _striped(result.stderr) == UPLOADS, result.stderr
    assert "data link 0 failed" not in result.stderr  # the data links went on


@pytest.mark.anyio
async def test_every_link_stalled_then_cut_under_striped_uploads(
    program: Program,  # noqa: F811
    short_dir: Path,  # noqa: F811
) -> None:
    """Through the resilience tests' faulty proxy: once the session and its data links are
    up, every route stalls, then every link is cut (a dead route replaced). The main link
    resumes, the data links are reopened and what they carried sent again; every upload
    lands whole."""
    started, _ = await anyio.to_thread.run_sync(_worker, short_dir, "resume_grace = 30\n")
    results: list[subprocess.CompletedProcess[str]] = []
    try:
        async with faulty_proxy(started.unix_url) as proxy:

            def run() -> None:
                results.append(program.run(proxy.url, "striped", env=_debug_env(), timeout=110))

            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, run)
                with anyio.fail_after(60):
                    while proxy.links < 1 + LINKS:
                        await anyio.sleep(0.005)
                proxy.stalled = True
                await anyio.sleep(0.3)
                await proxy.cut_all()
                proxy.stalled = False
    finally:
        await anyio.to_thread.run_sync(stop_worker, started.process)
    (result,) = results
    assert_sanitizer_clean(result)
    assert result.stdout.startswith("ok striped resumes="), result.stderr
    assert "resumed the session" in result.stderr, result.stderr
    assert _striped(result.stderr) == UPLOADS, result.stderr


#: The head of a MEMCPY_DTOH request as the proxy frames it (protocol 1.4).
DTOH_HEAD = b"HIPR\x04\x01\x11\x02"


def test_the_main_link_cut_inside_a_striped_download_request_is_resumed(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
) -> None:
    """As above for the first striped MEMCPY_DTOH: the caller resumes the session, the
    worker runs the replayed request and its chunks come on the data links, which were
    read throughout."""
    result = _cut_inside_the_first(program, worker, DTOH_HEAD)
    assert _striped_down(result.stderr) == DOWNLOADS, result.stderr
    assert _asked_again(result.stderr) == 0, result.stderr


class DataLinkRelay(OneSideRelay):
    """Marks (cuts, or freezes) on the data links only: every link but the first."""

    marked_main = False


def test_a_data_link_cut_under_a_striped_download_gets_the_bytes_asked_again(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
) -> None:
    """A data link cut inside the first striped download (10 MB into what the data links
    brought down: only downloads' chunks come down them): the read is asked again
    unstriped, every byte right; the data links are opened anew for the next copies,
    which go striped and whole."""
    started, _ = worker
    relay = DataLinkRelay(started.unix_url.removeprefix("unix://"), [], [10_000_000])
    try:
        result = program.run(
            f"tcp://127.0.0.1:{relay.port}", "striped", env=_debug_env(), timeout=110
        )
        assert_sanitizer_clean(result)
        assert result.stdout.strip() == "ok striped resumes=0", result.stderr
        assert relay.cuts == 1, result.stderr
        assert _asked_again(result.stderr) == 1, result.stderr
        assert _striped(result.stderr) == UPLOADS, result.stderr
        assert _striped_down(result.stderr) == DOWNLOADS, result.stderr
    finally:
        relay.close()


def test_a_data_link_gone_silent_under_a_striped_download_gets_the_bytes_asked_again(
    program: Program,  # noqa: F811
    short_dir: Path,  # noqa: F811
) -> None:
    """A data link that stops moving inside the first striped download (both sockets left
    open): the worker gives up on it after its frame timeout and fails the read, which is
    asked again unstriped; every byte right."""
    started, _ = _worker(short_dir, "frame_timeout = 2\nresume_grace = 30\n")
    relay = DataLinkRelay(started.unix_url.removeprefix("unix://"), [], [10_000_000], freeze=True)
    try:
        result = program.run(
            f"tcp://127.0.0.1:{relay.port}", "striped", env=_debug_env(), timeout=110
        )
        assert_sanitizer_clean(result)
        assert result.stdout.strip() == "ok striped resumes=0", result.stderr
        assert relay.cuts == 1, result.stderr
        assert _asked_again(result.stderr) == 1, result.stderr
        assert "striped download lost a data link" in result.stderr, result.stderr
        assert _striped_down(result.stderr) == DOWNLOADS, result.stderr
    finally:
        relay.close()
        stop_worker(started.process)


def test_data_links_default_to_the_cpus(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
) -> None:
    """HIPR_DATA_LINKS unset: 4 where the process may use 4 CPUs or more, else none (a
    striped copy only costs on 2 cores); taskset to one CPU, none whatever the machine."""
    started, metrics = worker
    env = {"HIPR_PROXY_DEBUG": "1", "HIPR_STRIPE_MIN_BYTES": STRIPE_MIN}
    result = program.run(started.unix_url, "striped", env=env, timeout=110)
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok striped resumes=0", result.stderr
    expected = UPLOADS if usable_cpus() >= 4 else 0
    assert _striped(result.stderr) == expected, result.stderr
    assert _striped_down(result.stderr) == 3 * expected, result.stderr
    if expected == 0:
        assert "data link" not in result.stderr, result.stderr
    assert _data_links(metrics) == (2 * LINKS if expected else 0)


def _chunk_frame(request_id: int, flags: int, offset: int, data: bytes) -> bytes:
    """A download chunk's frame as the worker writes it (or not quite, by its flags)."""
    args = cbor2.dumps({"offset": offset})
    payload = len(args).to_bytes(4, "little") + args + data
    return HEADER.pack(MAGIC, 0x0104, 0x0004, request_id, flags, len(payload)) + payload


class InjectingRelay(Relay):
    """A relay that slips `inject` into the first data link of the first session, ahead of
    the first bytes that come down it after its DATA_LINK reply (the first download's
    chunks: the worker sends nothing else there), at a frame's boundary."""

    inject: bytes = b""
    injected: int = 0
    _data_links: int = 0

    def _pump(
        self, src: socket.socket, dst: socket.socket, up: bool, pair: tuple[socket.socket, ...]
    ) -> None:
        with self._lock:
            self._data_links += not up
            mine = not up and self._data_links == 2  # the session's link is the first
        pieces = 0
        while data := _recv(src):
            if mine and pieces == 1 and not self.injected:
                data = self.inject + data
                self.injected = 1
            pieces += 1
            try:
                dst.sendall(data)
            except OSError:
                break
        end_pair(pair)


@pytest.mark.parametrize(
    ("flags", "asked_again"),
    [
        # A chunk of an earlier request (id 1, long answered): read and dropped.
        (0x2, 0),
        # Not a download's chunk (flags 0): the link ends, the read is asked again.
        (0x0, 1),
    ],
    ids=["stale", "malformed"],
)
def test_a_frame_of_no_download_on_a_data_link(
    program: Program,  # noqa: F811
    worker: tuple[Worker, str],
    flags: int,
    asked_again: int,
) -> None:
    started, _ = worker
    relay = InjectingRelay(started.unix_url.removeprefix("unix://"), [], [])
    relay.inject = _chunk_frame(1, flags, 0, bytes(range(256)) * 16)
    try:
        result = program.run(
            f"tcp://127.0.0.1:{relay.port}", "striped", env=_debug_env(), timeout=110
        )
        assert_sanitizer_clean(result)
        assert relay.injected == 1, result.stderr
        assert result.stdout.strip() == "ok striped resumes=0", result.stderr
        assert _asked_again(result.stderr) == asked_again, result.stderr
        assert _striped_down(result.stderr) == DOWNLOADS, result.stderr
    finally:
        relay.close()
