"""Seeing what hipr does: structured logging (``log``), Prometheus metrics
(``metrics``), device telemetry from NVML / amdsmi (``telemetry``) and the worker's
observer hooks (``observer``) that feed the metrics.

Lower than the worker: nothing here imports the worker; what the metrics read of it is
described by small protocols in ``metrics``.
"""
