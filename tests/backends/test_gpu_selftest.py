"""The GPU self-test (``python -m hipr.testing.gpu_selftest``) against the emulator.

Every case the emulator can run passes, the ones it cannot (a device compiler, NVIDIA's
prelude, capture of the per-thread default stream) are reported as such and not run,
and a case whose backend gives a wrong answer fails the run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hipr.backends import load_backend
from hipr.testing import _selftest_harness as harness
from hipr.testing import gpu_selftest as st

REPO = Path(__file__).resolve().parents[2]


def _emulator_ctx() -> harness.Ctx:
    backend = load_backend("emulator")
    backend.bind_thread(0)
    return harness.Ctx(backend, "emulator", 0, harness.Sizes.small())


def _by_name(name: str) -> harness.CaseSpec:
    (spec,) = [s for s in st.CASES if s.name.startswith(name)]
    return spec


def test_every_case_the_emulator_can_run_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert st.main(["--backend", "emulator"]) == 0
    out = capsys.readouterr().out
    expected_na = {s.name for s in st.CASES if s.needs}
    assert expected_na  # the compiler cases, the default-stream capture
    for spec in st.CASES:
        verdict = "N/A  " if spec.name in expected_na else "PASS "
        assert f"{verdict} {spec.name}" in out, spec.name
    assert "FAIL" not in out
    ran = len(st.CASES) - len(expected_na)
    assert f"{ran} passed, 0 failed, {len(expected_na)} not for this backend" in out


def test_cases_not_for_a_backend_are_named_with_what_it_lacks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ctx = _emulator_ctx()
    try:
        compile_case = _by_name("compile BUILTIN_SOURCE")
        failed, not_run = st.run_cases(ctx, [compile_case])
    finally:
        ctx.b.close()
    assert (failed, not_run) == ([], [compile_case.name])
    assert "(the emulator backend has no nvidia)" in capsys.readouterr().out
    assert harness.CAPABILITIES["cuda"] >= compile_case.needs


def test_a_wrong_answer_fails_its_case(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend whose downloads come back zeroed fails the copies case, with a traceback."""
    ctx = _emulator_ctx()
    real = ctx.b.memcpy_dtoh

    def zeroed(dst: Any, src: int, stream: Any = None) -> None:
        real(dst, src, stream)
        np.frombuffer(dst, np.uint8)[:] = 0

    monkeypatch.setattr(ctx.b, "memcpy_dtoh", zeroed)
    copies = _by_name("copies:")
    try:
        failed, not_run = st.run_cases(ctx, [copies])
    finally:
        monkeypatch.undo()
        ctx.b.close()
    assert (failed, not_run) == ([copies.name], [])
    out = capsys.readouterr().out
    assert f"FAIL  {copies.name}" in out and "AssertionError" in out


def test_the_hand_packer_matches_the_c_layout() -> None:
    harness.check_pack_layout()
    assert len(harness.pack(("i8", "f64"), [1, 2.0])) == 16  # the double aligned to 8
    assert len(harness.pack(("f64", "i8"), [2.0, 1])) == 9  # no trailing padding


def test_expect_error_takes_any_of_several_codes() -> None:
    ctx = _emulator_ctx()
    try:
        codes = (harness.E.hipErrorInvalidValue, harness.E.hipErrorOutOfMemory)
        exc = harness.expect_error(codes, lambda: ctx.b.malloc(1 << 62))
        assert exc.code in codes
        with pytest.raises(AssertionError, match="nothing raised"):
            harness.expect_error(harness.E.hipErrorInvalidValue, lambda: None)
    finally:
        ctx.b.close()


def test_the_script_runs_the_module() -> None:
    """``scripts/gpu-backend-selftest`` (cited by docs/verified.md) is a wrapper that runs
    this module with its arguments."""
    script = (REPO / "scripts" / "gpu-backend-selftest").read_text()
    assert 'exec .venv/bin/python -m hipr.testing.gpu_selftest "$@"' in script
    done = subprocess.run(
        [sys.executable, "-m", "hipr.testing.gpu_selftest", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "--backend {cuda,emulator,hip}" in done.stdout
