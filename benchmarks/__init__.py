"""hipr's benchmark suite (issue 7): each figure beside a baseline measured in the same run.

``benchmarks.suite`` holds the six benchmarks, ``benchmarks.baselines`` the bare
references they are compared with; ``hipr bench`` (``hipr/cli/bench.py``) runs them.
"""
