"""The proxy's libcuda.so.1 stream capture, graphs, stream-ordered allocation and managed
memory's refusal, checked from C (tests/proxy/cuda/graph_check.c) against an emulator
worker, built with the library under AddressSanitizer (leak checking on) and
UndefinedBehaviorSanitizer."""

from __future__ import annotations

from pathlib import Path

from hipr.proxy.build import CUDA_LIBRARY, CUDA_SUBDIR
from tests.proxy.sanitized import (
    SANITIZED_FLAGS,
    cc,
    linked_to,
    run_clean,
)

HERE = Path(__file__).resolve().parent
PROGRAM = HERE / "cuda" / "graph_check.c"


def test_capture_graphs_and_pools_under_sanitizers(
    sanitized_libs: Path, worker_url: str, tmp_path: Path
) -> None:
    program = tmp_path / "graph_check"
    cuda = sanitized_libs / CUDA_SUBDIR
    cc(
        [
            *SANITIZED_FLAGS, f"-I{HERE / 'c'}", str(PROGRAM), "-o", str(program),
            *linked_to(cuda, CUDA_LIBRARY),
        ]
    )  # fmt: skip
    result = run_clean(program, HIPR_URL=worker_url)
    # Each refusal names itself once, however often it is met.
    for line in (
        "cuMemAllocManaged is not served: the worker serves no managed memory",
        "cuStreamBeginCapture: the default streams",
        "cuGraphInstantiate: device-launchable graphs",
        "cuGraphAddMemsetNode: a pattern of differing bytes",
        "cuGraphAddMemcpyNode: only copies between device memory",
        "cuGraphExecUpdate_v2 is not served",
        "cuGraphGetNodes: a graph's node handles are not served",
    ):
        assert result.stderr.count(line) == 1, (line, result.stderr)
