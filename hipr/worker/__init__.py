"""The worker: the listener and its connections, sessions and what they own (handles,
quotas, tenants, the GPU thread, the reply cache), process isolation, systemd
integration and the worker's configuration.

Calls flow listener (``server``) → ``connection`` → ``session`` → handler registry
(``hipr.handlers``) → GPU backend (``hipr.backends``). Import the module you need;
this package imports nothing itself, so loading one part never loads the rest.
"""
