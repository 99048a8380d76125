"""``python -m benchmarks.proxy.ab``: proxy_bench against two emulator workers of this
tree (the second named with its own proxy_bench), one round, every figure read and
printed for each worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.proxy import ab
from hipr.proxy.build import HIP_LIBRARY, LIB_DIR
from tests.proxy.sanitized import cc, linked_to

ROOT = Path(__file__).resolve().parents[2]


def test_ab_runs_proxy_bench_against_each_worker(
    proxy_libs: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = tmp_path / "proxy_bench"
    cc(["-std=c11", "-O1", str(ROOT / "benchmarks/proxy/proxy_bench.c"), "-o", str(bench),
        *linked_to(LIB_DIR, HIP_LIBRARY)])  # fmt: skip
    record = tmp_path / "rounds.json"
    argv = ["--bench", str(bench), "--backend", "emulator", "--mib", "1", "--rounds", "1",
            "--worker", f"one:{ROOT}", "--worker", f"two:{ROOT}:{bench}",
            "--json", str(record)]  # fmt: skip
    assert ab.main(argv) == 0
    out = capsys.readouterr().out
    table = out[out.index("figure") :].splitlines()
    assert table[0].split()[-2:] == ["one", "two"]
    for _, label in ab.FIGURES:
        row = next(line for line in table if line.startswith(label))
        assert len(row[len(label) :].split()) >= 2, row
    assert "worker CPU per proxy_bench run" in out
    assert record.read_text().count('"memcpy_h2d_GBps"') == 2
