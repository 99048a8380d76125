"""hipr's studies beside the benchmark suite: stage traces, A/B runs of workers, bulk copies.

The suite that ``hipr bench`` runs, its baselines and floors live in the package
(``hipr.bench``), so the command works from an installed wheel; these modules import
them from there, never the other way round. ``python -m benchmarks.baselines`` and
``python -m benchmarks.floors`` still start the two servers.
"""
