"""The benchmark suite ``hipr bench`` runs: each figure beside a baseline measured in the
same run (issues 7 and 13).

``suite`` holds the async client's benchmarks and ``baselines`` the bare anyio references
they are compared with; ``syncbench`` the synchronous client's, beside the machine's
``floors``; ``servers`` starts the processes a run needs, ``runner`` runs the suite as the
command's options say and ``results`` shows what it found. ``hipr/cli/bench.py`` is the
command line; the studies that need a checkout stay in ``benchmarks/``.
"""
