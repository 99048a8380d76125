import sys, anyio
from hipr.backends import load_backend
from hipr.testing.faults import FaultOptions, run_fault_campaign
r = anyio.run(lambda: run_fault_campaign(FaultOptions(seed=3, sessions=16, seconds=float(sys.argv[1]), probability=0.05), inner=load_backend("cuda"), trace=True))
print(r.summary()); print("\n".join(r.memory.lines())); print("\n".join(r.trace)); print("PASS" if r.ok else "FAIL")
