#!/usr/bin/env bash
# The committed GPU run: reliability report (fuzz >= 1M frames, faults) with the cuda backend.
set -o pipefail
cd "$(dirname "$0")/.."
echo "commit $(cat .gpu/REV)" | tee $OUT/rev.txt
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv | tee $OUT/nvidia-smi.txt
timeout 420 python3 -c 'import sys; from hipr.testing.report import main_report; sys.exit(main_report())' --backend cuda --long --no-load --trace-leaks --seed 34 --output $OUT/report.md > $OUT/report-stdout.txt 2> $OUT/report-stderr.txt; echo "rc $?"
grep -v "^  |\|violation\|fuzz trace:   \|faults trace:   " $OUT/report.md | cut -c1-700
grep -c "  |" $OUT/report.md
echo "=== faults x3 on one backend (device memory plateau?)"
timeout 100 python3 .gpu/faults2.py 2>&1 | grep -v "^\[\|^20" | tee $OUT/faults-x3.txt
