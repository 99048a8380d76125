#!/usr/bin/env bash
# On a GPU host: the CUDA proxy's capture, graphs and stream-ordered allocation against a
# cuda worker on a unix socket (started without the proxy on its library path): the C
# check (tests/proxy/cuda/graph_check.c) through the proxy, then graphs_gpu_check.py's
# CuPy and PyTorch rows on NVIDIA's driver and through `hipr run --api cuda`, their JSON
# lines compared (every row but the mapped libcuda must be equal).
#
#   tests/proxy/cuda/graphs_gpu.sh [PYTHON]
set -uo pipefail
cd "$(dirname "$0")/../../.."
PY=${1:-python3}
dir=$(mktemp -d)
sock="$dir/w.sock"
env -u LD_LIBRARY_PATH "$PY" -m hipr worker --backend cuda --listen "unix://$sock" \
    --log-level warning >"$dir/worker.log" 2>&1 &
worker=$!
trap 'kill "$worker" 2>/dev/null; wait "$worker" 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 300); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { echo "no worker: $(cat "$dir/worker.log")"; exit 1; }
export HIPR_URL="unix://$sock"
lib=$("$PY" -m hipr proxy --path)/cuda
status=0
echo "== C check: capture, graphs, stream-ordered allocation, managed refused"
cc -std=c11 -O1 -Itests/proxy/c tests/proxy/cuda/graph_check.c -o "$dir/graph_check" \
    -L"$lib" -l:libcuda.so.1 -Wl,-rpath,"$lib" || status=1
LD_LIBRARY_PATH="$lib" timeout 30 "$dir/graph_check" || status=1
for what in cupy torch; do
    echo "== $what on NVIDIA's driver"
    timeout 40 "$PY" tests/proxy/cuda/graphs_gpu_check.py "$what" | tee "$dir/$what.local" || status=1
    echo "== $what through hipr run --api cuda"
    timeout 60 "$PY" -m hipr run --api cuda -- "$PY" tests/proxy/cuda/graphs_gpu_check.py "$what" \
        | tee "$dir/$what.proxied" || status=1
    "$PY" - "$dir/$what.local" "$dir/$what.proxied" <<'PYEOF' || status=1
import json, sys
def last(f):
    lines = open(f).read().strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        return {}
local, proxied = last(sys.argv[1]), last(sys.argv[2])
print("mapped:", local.pop("libcuda", None), "locally,", proxied.pop("libcuda", None), "proxied")
same = bool(local) and local == proxied
print("rows equal to the local run's:" if same else "DIFFERENT from the local run:", sorted(local))
sys.exit(0 if same else 1)
PYEOF
done
echo "== worker log"; tail -20 "$dir/worker.log"
echo "status $status"
exit $status
