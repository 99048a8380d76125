"""The worker as a long-running service: started by ``hipr worker``, stopped by a signal.

Signals (SIGTERM and SIGINT drain, SIGHUP reloads), systemd's readiness, status and
watchdog notifications, socket activation, and the stop's hard deadline; what it serves
is ``hipr.worker.server``'s :class:`~hipr.worker.server.Worker`.
"""

from __future__ import annotations

import gc
import signal
from pathlib import Path

import anyio
import structlog

from hipr.errors import HipError
from hipr.observability.metrics import MetricsServer, start_metrics_server
from hipr.worker import systemd
from hipr.worker.admission import raise_open_file_limit
from hipr.worker.config import WorkerConfig
from hipr.worker.deadline import EXIT_MARGIN, ShutdownDeadline, exit_now
from hipr.worker.isolation import ChildLink, die_with_parent
from hipr.worker.server import Worker, check_token_exposure, load_configured_backend

__all__ = ["run_worker"]

log = structlog.get_logger("hipr.worker")


async def run_worker(config: WorkerConfig, config_path: Path | None = None) -> None:
    """Run the worker until SIGINT or SIGTERM (which drain it); SIGHUP reloads.

    Under systemd it reports readiness and status (``Type=notify``), pings the
    watchdog, and serves sockets passed by socket activation instead of ``listen``.
    """
    # A tenant's child worker: die with the parent (first, before the slow backend load).
    die_with_parent()
    # Every client and every unfinished handshake holds a descriptor: take all we may.
    open_files = raise_open_file_limit()
    try:
        backend = load_configured_backend(config)
    except HipError as exc:
        log.error("backend unavailable", error=str(exc))
        raise
    log.info("backend selected", backend=backend.name, devices=backend.device_count())
    metrics: MetricsServer | None = None
    worker = Worker(config, backend)
    # What exists now (modules, the backend, the config) lives as long as the worker:
    # out of the collector's full passes, which walk every object and which a flood of
    # connections triggers (a 100 ms pause of the loop, measured with 300 at once).
    gc.freeze()
    caps = worker.admission.caps
    log.info(
        "connection limits",
        open_files=open_files,
        max_pending_handshakes=caps.total,
        max_pending_handshakes_per_peer=caps.per_source,
    )
    worker.child_link = ChildLink.from_env()
    worker.restart_on_failure = True
    check_token_exposure(config, worker.tenants.anonymous, config.listen)
    try:
        async with anyio.create_task_group() as tg:
            if config.metrics_listen is not None:
                metrics = start_metrics_server(worker, config.metrics_listen)
            activated = systemd.listen_fds()
            if activated:
                urls = await tg.start(worker.serve_sockets, activated)
            else:
                urls = await tg.start(worker.serve)
            systemd.notify(f"READY=1\nSTATUS=serving on {', '.join(urls)}")
            if (interval := systemd.watchdog_interval()) is not None:
                tg.start_soon(_watchdog, interval)
            tg.start_soon(_status_reporter, worker)
            with anyio.open_signal_receiver(
                signal.SIGTERM, signal.SIGINT, signal.SIGHUP
            ) as signals:
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        systemd.notify("RELOADING=1")
                        worker.reload(config_path)
                        systemd.notify("READY=1")
                        continue
                    log.info("stopping", signal=signal.Signals(signum).name)
                    systemd.notify("STOPPING=1\nSTATUS=draining")
                    await _stop(worker)
                    tg.cancel_scope.cancel()
                    break
    finally:
        if metrics is not None:
            metrics.close()
        backend.close()
        log.info("stopped")
    if worker.exit_status:
        raise SystemExit(worker.exit_status)


def _tenant_pids(worker: Worker) -> dict[str, int]:
    return {} if worker.isolation is None else worker.isolation.child_pids()


async def _stop(worker: Worker) -> None:
    """Drain within ``shutdown_timeout``; then exit at once (EXIT_CUT_SHORT) if work is
    still under way, which only a kernel that does not end can cause. A thread exits
    the process ``EXIT_MARGIN`` seconds later still, should the event loop be stuck."""
    pids = _tenant_pids(worker)
    deadline = ShutdownDeadline(
        worker.config.shutdown_timeout + EXIT_MARGIN,
        worker.under_way,
        lambda: {**pids, **_tenant_pids(worker)},
    )
    deadline.arm()
    await worker.shutdown()
    left = worker.under_way()
    # Only those running when the stop began (one that retired itself earlier is not).
    cut = {t: rc for t, rc in worker.children_exits.items() if rc != 0 and t in pids}
    if left["sessions"] or cut:
        exit_now(
            {**left, "tenant_processes_cut_short": cut},
            {**pids, **_tenant_pids(worker)},
            because="work still running when the drain ended (shutdown_timeout "
            f"{worker.config.shutdown_timeout:g} s; a tenant process ended early counts)",
        )
    deadline.disarm()


async def _watchdog(interval: float) -> None:
    while True:
        systemd.notify("WATCHDOG=1")
        await anyio.sleep(interval)


async def _status_reporter(worker: Worker) -> None:
    while True:
        await anyio.sleep(10)
        systemd.notify(f"STATUS={len(worker.sessions)} sessions, {len(worker.connections)} links")
