"""The worker: the service and its listeners, each client's link (handshake, reader,
executor, writer), tenants, process isolation, systemd integration and the worker's
configuration. A session's own state (handles, quotas, the GPU thread, the reply cache)
lives below the handlers, in ``hipr.sessions``.

Calls flow service → listener (``server``) → ``client_link`` → ``request_executor`` →
handler registry (``hipr.handlers``) → GPU backend (``hipr.backends``). Import the
module you need; this package imports nothing itself, so loading one part never loads
the rest.
"""
