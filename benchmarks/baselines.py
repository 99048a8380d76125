"""``python -m benchmarks.baselines``: the same server as ``python -m hipr.bench.baselines``
(the code lives in the package, so ``hipr bench`` runs from an installed wheel)."""

from hipr.bench.baselines import main

if __name__ == "__main__":
    raise SystemExit(main())
