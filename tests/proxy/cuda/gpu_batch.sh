#!/usr/bin/env bash
# One device call for issue 32's cuBLAS work, from the repository root of a copy whose
# proxy libraries and spy (build/spy) were built beforehand: CuPy and PyTorch on NVIDIA's
# driver behind the export-table spy, then through the proxy, traced (HIPR_PROXY_TRACE=2),
# and PyTorch locally. Everything goes to $OUT: each step's output with a summary of its
# trace (tests/proxy/cuda/spy_summary.py), and the whole traces compressed.
#
#   tests/proxy/cuda/gpu_batch.sh [STEPS...]   STEPS: spy cupy torch c cudart nvml plain
#                                             (default: spy cupy torch c cudart)
# `plain` runs scripts/cuda-gpu-check's c cudart cupy torch nvml untraced (the timings).
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
PY=python3
STEPS=${*:-spy cupy torch c cudart}
echo "tree: $(cat COMMIT 2>/dev/null || echo unknown)"
nvidia-smi -L 2>&1 | head -2
for step in $STEPS; do
    case $step in
    spy)
        HIPR_SPY_LOG="$OUT/spy.log" scripts/cuda-gpu-check "$PY" spy >"$OUT/spy.txt" 2>&1
        gzip -f "$OUT/spy.log" ;;
    cupy | torch)
        HIPR_PROXY_TRACE=2 timeout 400 scripts/cuda-gpu-check "$PY" "$step" >"$OUT/$step.txt" 2>"$OUT/$step.trace"
        echo "rc $?" >>"$OUT/$step.txt"
        {
            echo "== summary of the proxy's trace"
            "$PY" tests/proxy/cuda/spy_summary.py "$OUT/$step.trace" 2
            echo "== the trace's last 60 lines"
            tail -60 "$OUT/$step.trace"
        } >>"$OUT/$step.txt"
        gzip -f "$OUT/$step.trace" ;;
    c | cudart | nvml)
        scripts/cuda-gpu-check "$PY" "$step" >>"$OUT/c_cudart.txt" 2>&1
        echo "rc $?" >>"$OUT/c_cudart.txt" ;;
    plain)
        scripts/cuda-gpu-check "$PY" c cudart cupy torch nvml >"$OUT/plain.txt" 2>&1
        echo "rc $?" >>"$OUT/plain.txt" ;;
    esac
    echo "== $step done"
done
