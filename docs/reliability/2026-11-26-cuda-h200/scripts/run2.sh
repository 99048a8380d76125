#!/usr/bin/env bash
# GPU run 2: before (b9dc256's worker with the new campaign tools) and after (this branch).
set -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd); base=$here/../leaks-base
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv | tee $OUT/nvidia-smi.txt
echo "=== before: graph launched after free"; (cd $base && PYTHONPATH=/tmp/site:$base timeout 60 python3 .gpu/graph_after_free.py) 2>&1 | tee $OUT/before-graph-after-free.txt
echo "=== after: graph launched after free"; (cd $here && PYTHONPATH=/tmp/site:$here timeout 60 python3 .gpu/graph_after_free.py) 2>&1 | tee $OUT/after-graph-after-free.txt
echo "=== before: fuzz, tame kernels, 60 s"; (cd $base && PYTHONPATH=/tmp/site:$base timeout 120 python3 -c "import sys; from hipr.testing.report import main_fuzz; sys.exit(main_fuzz())" --backend cuda --minutes 1 --processes 4 --seed 13 --trace-leaks) > $OUT/before-fuzz.txt 2>&1; grep -v "^violation\|^good client error" $OUT/before-fuzz.txt | grep -v "^  " | tail -12; grep -c "^  " $OUT/before-fuzz.txt
echo "=== before: faults, 20 s"; (cd $base && PYTHONPATH=/tmp/site:$base timeout 90 python3 .gpu/faults.py 20) > $OUT/before-faults.txt 2>&1; grep -v "^  " $OUT/before-faults.txt | tail -8
echo "=== after: fuzz, tame kernels, 120 s"; (cd $here && PYTHONPATH=/tmp/site:$here timeout 200 python3 -c "import sys; from hipr.testing.report import main_fuzz; sys.exit(main_fuzz())" --backend cuda --minutes 2 --processes 4 --seed 13 --trace-leaks) > $OUT/after-fuzz.txt 2>&1; grep -v "^violation\|^good client error" $OUT/after-fuzz.txt | tail -14
echo "=== after: faults, 40 s"; (cd $here && PYTHONPATH=/tmp/site:$here timeout 120 python3 .gpu/faults.py 40) > $OUT/after-faults.txt 2>&1; tail -10 $OUT/after-faults.txt
nvidia-smi --query-gpu=memory.used --format=csv | tee -a $OUT/nvidia-smi.txt
