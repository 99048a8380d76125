"""``isolation = "process"``: each tenant's sessions run in a worker process of its own.

A kernel is code: inside one process it can address any device memory of that process,
whatever the worker checks on the wire. With process isolation the worker that
listens only authenticates; it then relays each connection, byte for byte, to a child
worker that serves that tenant alone (its own GPU context, its own address space), so
one tenant's kernels can neither read another's memory nor crash another's sessions.

The child is an ordinary ``hipr worker`` on a private Unix socket, configured with only
its tenant (same quotas) and a token known to the parent alone; quotas, resume and
exactly-once all work there unchanged.

Nothing outlives the parent: a child asks the kernel for SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``), and the private socket directory is locked (``flock``) for the
parent's life, so the next worker to start removes any directory whose lock is free.
Status crosses the process boundary over two private sockets in that directory, each
answering one JSON document per connection: each child's ``<tenant>.status.sock`` lists
its sessions (the parent polls them for ``/metrics`` and status), and the parent's
``parent.sock`` gives the whole worker's status, which a child returns for an admin call
(an operator's ``hipr status`` reaches a child like any session does).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog

from hipr.errors import HipError, HipErrorCode, SessionLostError
from hipr.sessions.module_store import StoreFigures
from hipr.worker.config import WorkerConfig
from hipr.worker.retirement import CONTEXT_LOST, Retirement, take_record
from hipr.worker.tenants import Quotas, Tenant, new_token, token_hash

log = structlog.get_logger("hipr.isolation")

#: How long a tenant's worker may take to start listening.
START_TIMEOUT = 60.0
#: The environment variable that tells a child worker its parent's pid.
PARENT_PID_ENV = "HIPR_PARENT_PID"
#: Socket directories are named ``hipr-tenants-<parent pid>-<random>``.
DIR_PREFIX = "hipr-tenants-"
#: Held (flock) by the parent for its whole life: a free lock means a dead parent.
LOCK_NAME = ".lock"
#: A directory without a lock file (a worker between mkdtemp and taking the lock) is
#: removed only once the pid in its name is gone and it is older than this.
UNLOCKED_AGE = 60.0
#: A child serves its sessions (JSON) on the Unix socket this variable names.
STATUS_SOCKET_ENV = "HIPR_STATUS_SOCKET"
#: A child asks the parent for the whole worker's status on this Unix socket.
PARENT_STATUS_ENV = "HIPR_PARENT_STATUS"
#: Set for a child of ``isolation = "session"``: it serves one session, then exits.
ONE_SESSION_ENV = "HIPR_ONE_SESSION"
#: The parent's status socket, in the private directory.
PARENT_SOCKET_NAME = "parent.sock"
#: Largest status document read from a peer (thousands of sessions fit).
MAX_STATUS_BYTES = 64 << 20
#: How often the parent refreshes its children's figures for ``/metrics``.
POLL_INTERVAL = 5.0
#: Bound on one status exchange with a child.
STATUS_TIMEOUT = 5.0
#: How often the parent looks for children that retired (their records: status and
#: metrics show a retirement within this).
REAP_INTERVAL = 0.25
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a tenant's child worker (``HIPR_PARENT_PID`` set): have the kernel SIGKILL this
    process when its parent dies, and exit now if the parent already has.

    SIGKILL rather than SIGTERM: with the parent gone its relays are gone too, so no
    client can reach this worker any more and there is nothing to drain; the GPU driver
    frees the context of a killed process.
    """
    expected = os.environ.get(PARENT_PID_ENV)
    if not expected:
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning("PR_SET_PDEATHSIG failed", errno=ctypes.get_errno())
    # The parent may have died between fork and prctl: the signal would never come.
    if str(os.getppid()) != expected:
        log.warning("the parent worker is gone; exiting", parent=expected)
        os._exit(1)


def runtime_base() -> Path:
    """Where socket directories go: systemd's ``RuntimeDirectory`` when it set one,
    else the temporary directory."""
    runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return Path(runtime) if runtime else Path(tempfile.gettempdir())


def remove_stale_dirs(base: Path) -> list[Path]:
    """Remove the socket directories under ``base`` whose worker died without cleaning up
    (their lock is free); the ones removed."""
    removed: list[Path] = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    uid = os.geteuid()
    for path in entries:
        if not path.name.startswith(DIR_PREFIX):
            continue
        try:
            info = path.lstat()
        except OSError:
            continue
        # Only our own real directories: never follow a link another user planted.
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            continue
        if _is_stale(path, info):
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                removed.append(path)
    if removed:
        log.info("removed socket directories of dead workers", paths=[str(p) for p in removed])
    return removed


def _is_stale(path: Path, info: os.stat_result) -> bool:
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        # Between mkdtemp and the lock, or a worker that never took one (an older
        # version, still running beside us): only a dead pid in the name, and age, say
        # it is gone. A name without a pid is an older version's: left alone.
        pid = _pid_of(path.name)
        return (
            pid is not None and not _pid_alive(pid) and time.time() - info.st_mtime > UNLOCKED_AGE
        )
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # its worker holds the lock: alive
    finally:
        os.close(fd)  # also drops a lock just taken
    return True


def _pid_of(name: str) -> int | None:
    """The parent's pid in ``hipr-tenants-<pid>-<random>``, or None."""
    head = name[len(DIR_PREFIX) :].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


@dataclass(slots=True)
class ChildStatus:
    """What the parent last learnt of one child worker."""

    tenant: str
    pid: int
    #: Resident memory of the child process (bytes), read from /proc; 0 where unknown.
    rss: int = 0
    #: The child's sessions as its admin status lists them (the parent's own left out).
    sessions: list[dict[str, Any]] = field(default_factory=list)
    #: Unix time of the answer; 0 until the child first answered.
    updated: float = 0.0
    #: Why the last status call failed, if it did.
    error: str | None = None
    #: The child's module stores by tenant (code objects kept to load by hash).
    module_stores: dict[str, StoreFigures] = field(default_factory=dict)

    @property
    def memory(self) -> int:
        """Device memory held by the child's sessions."""
        return sum(int(s.get("memory", 0)) for s in self.sessions)

    def to_wire(self) -> dict[str, Any]:
        """The child's row of the parent's status reply."""
        return {
            "tenant": self.tenant,
            "pid": self.pid,
            "rss": self.rss,
            "sessions": len(self.sessions),
            "memory": self.memory,
            "updated": self.updated,
            "error": self.error,
        }


def process_rss(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes; 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(slots=True)
class TenantProcess:
    """A running child worker of one tenant."""

    tenant: str
    process: anyio.abc.Process
    url: str
    token: str
    #: The Unix socket where the child lists its sessions.
    status_path: str = ""
    #: The child's name among the parent's children: the tenant's, or with
    #: ``isolation = "session"`` one per session.
    key: str = ""

    @property
    def socket_path(self) -> str:
        """The child's listening Unix socket."""
        return self.url[len("unix://") :]

    @property
    def serving(self) -> bool:
        """Running and listening: a child that retires (``hipr.worker.retirement``: a
        kernel fault, or runaway work) removes its socket at once and exits once its
        sessions are told."""
        return self.process.returncode is None and os.path.exists(self.socket_path)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def _quota_lines(quotas: Quotas) -> list[str]:
    return [
        f"{f.name} = {_toml_value(getattr(quotas, f.name))}"
        for f in fields(quotas)
        if getattr(quotas, f.name) is not None
    ]


class TenantProcesses:
    """Starts, finds and stops the per-tenant child workers."""

    def __init__(
        self,
        config: WorkerConfig,
        base: Path | None = None,
        *,
        per_session: bool = False,
        on_retired: Callable[[Retirement], object] | None = None,
    ) -> None:
        self.config = config
        #: ``isolation = "session"``: a fresh child for every session.
        self.per_session = per_session
        self._started = 0
        #: Children that retired (or stopped serving), until they exit.
        self._retiring: list[TenantProcess] = []
        #: Children that retired themselves, by (tenant, reason).
        self.retirements: Counter[tuple[str, str]] = Counter()
        #: Told of each retirement once its record is read (the worker notes runaway
        #: work stopped in its ledger).
        self.on_retired = on_retired
        #: Which child holds each session (its url), for routing RESUME.
        self.session_children: dict[str, str] = {}
        base = runtime_base() if base is None else base
        remove_stale_dirs(base)
        self._dir = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-", dir=base))
        os.chmod(self._dir, 0o700)
        # Held until this process ends, however it ends: the kernel drops the lock then.
        self._dir_lock = os.open(self._dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._dir_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._children: dict[str, TenantProcess] = {}
        self._lock = anyio.Lock()
        #: Which tenant's process holds each session, for routing RESUME.
        self.session_tenants: dict[str, str] = {}
        #: The children's figures as last polled (``/metrics`` reads these).
        self.statuses: dict[str, ChildStatus] = {}

    @property
    def directory(self) -> Path:
        """The private directory of the children's sockets and configs."""
        return self._dir

    def child_pid(self, tenant: str) -> int | None:
        """The pid of ``tenant``'s worker process, if one runs."""
        child = self._children.get(tenant)
        return None if child is None or child.process.returncode is not None else child.process.pid

    @property
    def resets(self) -> dict[str, int]:
        """Context losses (children retired after a kernel fault), by tenant."""
        return {t: n for (t, reason), n in self.retirements.items() if reason == CONTEXT_LOST}

    def child_pids(self) -> dict[str, int]:
        """The pid of each tenant's (with ``per_session``, each session's) worker
        process still running, by its key."""
        return {
            name: child.process.pid
            for name, child in self._children.items()
            if child.process.returncode is None
        }

    async def child_for(self, tenant: Tenant) -> TenantProcess:
        """``tenant``'s worker process, started if it is not running (with
        ``per_session``, a new process every time)."""
        async with self._lock:
            self._reap()
            if self.per_session:
                fresh = await self._start(tenant)
                self._children[fresh.key] = fresh
                return fresh
            child = self._children.get(tenant.name)
            if child is None or not child.serving:
                if child is not None:
                    self._drop(child)
                child = await self._start(tenant)
                self._children[tenant.name] = child
            return child

    def note_session(self, session_id: str, tenant: str, url: str) -> None:
        """The child at ``url`` opened ``session_id`` of ``tenant`` (for RESUME)."""
        self.session_tenants[session_id] = tenant
        self.session_children[session_id] = url

    async def child_holding(self, session_id: str, tenant: Tenant) -> TenantProcess:
        """The child that holds ``session_id``: its own, while it serves; else the
        tenant's current child (which answers that the session is gone)."""
        url = self.session_children.get(session_id)
        for child in self._children.values():
            if child.url == url and child.serving:
                return child
        if self.per_session:
            raise SessionLostError(
                message=f"session {session_id} no longer exists: its worker process ended"
            )
        return await self.child_for(tenant)

    def _drop(self, child: TenantProcess) -> None:
        """Forget a child that retired or died (a retiring one is kept to be reaped)."""
        self._children.pop(child.key, None)
        self.session_tenants = {
            s: t
            for s, t in self.session_tenants.items()
            if self.session_children.get(s) != child.url
        }
        self.session_children = {s: u for s, u in self.session_children.items() if u != child.url}
        if child.process.returncode is None:
            self._retiring.append(child)  # reaped once it exits
        retirement = take_record(child.socket_path)
        if retirement is None:
            if not self.per_session:
                log.warning("tenant worker exited; starting a new one", tenant=child.tenant)
            return
        # The child's own tenant: a record cannot speak for another.
        self.retirements[(child.tenant, retirement.reason)] += 1
        log.warning("tenant worker retired", tenant=child.tenant, reason=retirement.reason)
        if self.on_retired is not None:
            try:
                self.on_retired(Retirement(child.tenant, retirement.reason, retirement.details))
            except Exception:
                log.exception("noting a retirement failed", tenant=child.tenant)

    def _reap(self) -> None:
        """Drop children that stopped serving, and forget retired ones that exited."""
        for child in list(self._children.values()):
            if not child.serving:
                self._drop(child)
        self._retiring = [c for c in self._retiring if c.process.returncode is None]

    @property
    def parent_socket(self) -> Path:
        """Where the parent serves the whole worker's status to its children."""
        return self._dir / PARENT_SOCKET_NAME

    def _write_config(self, tenant: Tenant, token: str, socket_path: Path) -> Path:
        config = self.config
        tenants_path = self._dir / f"{tenant.name}.{self._started}.tenants.toml"
        tenants_path.write_text(
            "\n".join(
                [
                    f"[tenants.{json.dumps(tenant.name)}]",
                    f'tokens = ["{token_hash(token)}"]',
                    *_quota_lines(tenant.quotas),
                ]
            )
            + "\n"
        )
        worker_path = self._dir / f"{tenant.name}.{self._started}.worker.toml"
        lines = [
            f"listen = [{_toml_value('unix://' + str(socket_path))}]",
            f"backend = {_toml_value(config.backend)}",
            f"max_frame_bytes = {config.max_frame_bytes}",
            f"heartbeat_interval = {config.heartbeat_interval!r}",
            f"heartbeat_timeout = {config.heartbeat_timeout!r}",
            f"resume_grace = {config.resume_grace!r}",
            f"shutdown_timeout = {config.shutdown_timeout!r}",
            f"runaway_grace = {config.runaway_grace!r}",
            f"tenants_file = {_toml_value(tenants_path)}",
            'isolation = "none"',  # one tenant here: the parent keeps tenants apart
            f"log_level = {_toml_value(config.log_level)}",
            f"log_format = {_toml_value(config.log_format)}",
            # The operator's admin token works in the child: `hipr status` lands there.
            *(
                [f"admin_token_sha256 = {_toml_value(config.admin_token_sha256)}"]
                if config.admin_token_sha256
                else []
            ),
            "[emulator]",
            f"device_count = {config.emulator.device_count}",
            f"total_memory = {config.emulator.total_memory}",
            f"device_name = {_toml_value(config.emulator.device_name)}",
        ]
        worker_path.write_text("\n".join(lines) + "\n")
        return worker_path

    async def _start(self, tenant: Tenant) -> TenantProcess:
        token = new_token()
        self._started += 1
        # A new name for each child: a retiring one may still hold its old socket.
        key = f"{tenant.name}.{self._started}" if self.per_session else tenant.name
        socket_path = self._dir / f"{tenant.name}.{self._started}.sock"
        status_path = self._dir / f"{tenant.name}.{self._started}.status.sock"
        for stale in (socket_path, status_path):
            stale.unlink(missing_ok=True)
        config_path = self._write_config(tenant, token, socket_path)
        process = await anyio.open_process(
            [sys.executable, "-m", "hipr", "worker", "--config", str(config_path)],
            stdin=None,
            stdout=None,
            stderr=None,
            env={
                **os.environ,
                PARENT_PID_ENV: str(os.getpid()),
                STATUS_SOCKET_ENV: str(status_path),
                PARENT_STATUS_ENV: str(self.parent_socket),
                **({ONE_SESSION_ENV: "1"} if self.per_session else {}),
            },
        )
        listening = False
        with anyio.move_on_after(START_TIMEOUT):
            # Polled: a socket file appearing has no event to wait on. The file exists
            # from bind(), before listen(): only a connection that succeeds says ready.
            while not listening and process.returncode is None:
                listening = await _accepts(socket_path)
                if not listening:
                    await anyio.sleep(0.02)
        if not listening:
            if process.returncode is None:
                process.kill()
            await process.wait()
            raise HipError(
                HipErrorCode.hipErrorNotInitialized,
                f"the worker process of tenant {tenant.name!r} did not start "
                f"(exit status {process.returncode}); see the worker's log",
            )
        log.info("tenant worker started", tenant=tenant.name, pid=process.pid)
        return TenantProcess(
            tenant.name, process, f"unix://{socket_path}", token, str(status_path), key
        )

    async def poll(self) -> list[ChildStatus]:
        """Ask every running child for its sessions (and read its RSS); the answers, also
        kept in :attr:`statuses`. A child that does not answer keeps its last figures,
        with the error."""
        self._reap()
        children = [c for c in self._children.values() if c.process.returncode is None]
        for name in set(self.statuses) - {c.key for c in children}:
            del self.statuses[name]

        async def one(child: TenantProcess) -> None:
            status = self.statuses.get(child.key)
            if status is None or status.pid != child.process.pid:
                status = self.statuses[child.key] = ChildStatus(child.tenant, child.process.pid)
            status.rss = process_rss(child.process.pid)
            try:
                reply = await fetch_json(child.status_path)
                rows = list(reply["sessions"])
            except (OSError, TimeoutError, ValueError, KeyError, TypeError) as exc:
                status.error = f"{type(exc).__name__}: {exc}"
                return
            status.sessions = [{**row, "worker_pid": child.process.pid} for row in rows]
            stores = reply.get("module_stores")
            status.module_stores = {
                str(tenant): figures
                for tenant, row in (stores.items() if isinstance(stores, dict) else ())
                if (figures := StoreFigures.from_wire(row)) is not None
            }
            status.updated = time.time()
            status.error = None

        async with anyio.create_task_group() as tg:
            for child in children:
                tg.start_soon(one, child)
        return [self.statuses[c.key] for c in children if c.key in self.statuses]

    async def reap_forever(self, interval: float = REAP_INTERVAL) -> None:
        """Notice children that retired or died every ``interval`` seconds (their
        records counted at once, not only at the tenant's next connection)."""
        while True:
            async with self._lock:
                self._reap()
            await anyio.sleep(interval)

    async def poll_forever(self, interval: float = POLL_INTERVAL) -> None:
        """Refresh :attr:`statuses` every ``interval`` seconds (for ``/metrics``, which
        is served from another thread and cannot ask the children itself)."""
        while True:
            if self._children:
                await self.poll()
            await anyio.sleep(interval)

    async def aclose(self) -> dict[str, int | None]:
        """Stop every child (SIGTERM: they drain and tell their clients), then clean up;
        each serving child's exit status, by its key (non-zero: its work was cut short,
        or it was killed; children already retiring are not counted)."""
        serving = list(self._children.items())
        children = [*self._children.values(), *self._retiring]
        self._children.clear()
        self._retiring.clear()
        for child in children:
            if child.process.returncode is None:
                child.process.send_signal(signal.SIGTERM)
        with anyio.move_on_after(self.config.shutdown_timeout + 5):
            for child in children:
                await child.process.wait()
        for child in children:
            if child.process.returncode is None:
                child.process.kill()
                await child.process.wait()
        self.statuses.clear()
        shutil.rmtree(self._dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self._dir_lock)
        return {key: child.process.returncode for key, child in serving}


async def _accepts(path: Path) -> bool:
    """True when something listens on the Unix socket ``path`` (a probe: connect, close)."""
    try:
        stream = await anyio.connect_unix(str(path))
    except OSError:
        return False
    await stream.aclose()
    return True


async def serve_json(
    path: Path,
    produce: Callable[[], Awaitable[Any]],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Answer every connection on the Unix socket ``path`` with ``produce()`` as JSON,
    then close it; until cancelled. Only this user reaches it (the directory is 0700)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a socket left by an earlier process of the same name
    listener = await anyio.create_unix_listener(path)

    async def answer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                document = json.dumps(await produce()).encode()
                await stream.send(document)
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the asker left
            except Exception:  # a status that failed must not stop the listener
                log.exception("status request failed", socket=str(path))

    async with listener:
        task_status.started()
        await listener.serve(answer)


async def fetch_json(path: str | Path, timeout: float = STATUS_TIMEOUT) -> Any:
    """The JSON document served on the Unix socket ``path`` (TimeoutError past
    ``timeout``, ValueError for a malformed or oversized one)."""
    data = bytearray()
    with anyio.fail_after(timeout):
        async with await anyio.connect_unix(str(path)) as stream:
            while True:
                try:
                    data += await stream.receive(1 << 20)
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
                if len(data) > MAX_STATUS_BYTES:
                    raise ValueError(f"status document over {MAX_STATUS_BYTES} bytes")
    return json.loads(data)


@dataclass(frozen=True, slots=True)
class ChildLink:
    """What a tenant's child worker knows of its parent (from the environment)."""

    #: Where this child serves its sessions.
    status_socket: Path
    #: Where the parent serves the whole worker's status.
    parent_status: Path
    #: ``isolation = "session"``: this child serves one session, then exits.
    one_session: bool = False

    @classmethod
    def from_env(cls) -> ChildLink | None:
        """The link when this process is a tenant's child worker, else None."""
        status, parent = os.environ.get(STATUS_SOCKET_ENV), os.environ.get(PARENT_STATUS_ENV)
        if not status or not parent:
            return None
        return cls(Path(status), Path(parent), os.environ.get(ONE_SESSION_ENV) == "1")
