"""The fault campaign twice over one cuda backend: does device memory plateau?"""
import anyio
from hipr.backends import load_backend
from hipr.testing.faults import FaultOptions, run_fault_campaign
backend = load_backend("cuda")
for round_ in (1, 2, 3):
    r = anyio.run(lambda: run_fault_campaign(FaultOptions(seed=round_, sessions=16, seconds=10.0, probability=0.05), inner=backend, trace=False))
    print(f"round {round_}: {r.summary()}")
    print("\n".join(r.memory.lines()))
