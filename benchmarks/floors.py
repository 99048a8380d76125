"""``python -m benchmarks.floors``: the same server as ``python -m hipr.bench.floors``
(the code lives in the package, so ``hipr bench`` runs from an installed wheel)."""

from hipr.bench.floors import main

if __name__ == "__main__":
    raise SystemExit(main())
