#!/usr/bin/env bash
# GPU diagnostic run 1 (before any product fix): where do the cuda backend's leaks come from?
set -o pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee $OUT/nvidia-smi.txt
git_rev=$(cat .gpu/REV 2>/dev/null); echo "tree: $git_rev" | tee $OUT/rev.txt
fuzz() { python3 -c 'import sys; from hipr.testing.report import main_fuzz; sys.exit(main_fuzz())' "$@"; }
echo "=== A: fuzz, cuda, kernels may fault (as issue 34 ran it), 60 s"
timeout 150 python3 -c 'import sys; from hipr.testing.report import main_fuzz; sys.exit(main_fuzz())' --backend cuda --minutes 1 --processes 4 --seed 11 --kernel-faults yes --trace-leaks 2>&1 | grep -v "^violation:" | tail -60 | tee $OUT/A-fuzz-wild.txt
echo "=== B: fuzz, cuda, kernels kept in bounds, 110 s"
timeout 200 python3 -c 'import sys; from hipr.testing.report import main_fuzz; sys.exit(main_fuzz())' --backend cuda --minutes 1.8 --processes 4 --seed 13 --kernel-faults no --trace-leaks 2>&1 | tail -60 | tee $OUT/B-fuzz-tame.txt
echo "=== C: faults, cuda, 40 s"
timeout 120 python3 - <<'PY' 2>&1 | tail -40 | tee $OUT/C-faults.txt
import anyio
from hipr.backends import load_backend
from hipr.testing.faults import FaultOptions, run_fault_campaign
r = anyio.run(lambda: run_fault_campaign(FaultOptions(seed=3, sessions=16, seconds=40.0, probability=0.05), inner=load_backend("cuda"), trace=True))
print(r.summary())
print("\n".join(r.memory.lines()))
print("\n".join(r.trace))
PY
echo done
