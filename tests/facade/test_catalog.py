"""The facade's names match hip-python's (where hip-python is installed, as in the dev
environment): function list and result counts, enums, hipDeviceProp_t's fields."""

from __future__ import annotations

import enum
import subprocess
import sys
from pathlib import Path

import pytest

from hipr import hip, hiprtc
from hipr.facade import catalog
from hipr.facade.props import FIELDS

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]

hp = pytest.importorskip("hip", reason="hip-python is not installed")


def _real() -> tuple[object, object]:
    from hip import hip as real_hip
    from hip import hiprtc as real_rtc

    return real_hip, real_rtc


def test_committed_catalog_is_current() -> None:
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen-hip-catalog"), "--check"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr


def test_every_hip_python_function_resolves() -> None:
    real_hip, real_rtc = _real()
    for name in catalog.HIP_FUNCTIONS:
        assert callable(getattr(hip, name)), name
        assert hasattr(real_hip, name)
    for name in catalog.HIPRTC_FUNCTIONS:
        assert callable(getattr(hiprtc, name)), name
        assert hasattr(real_rtc, name)


def test_enums_have_hip_pythons_members_and_values() -> None:
    real_hip, real_rtc = _real()
    for module, real in ((hip, real_hip), (hiprtc, real_rtc)):
        for name in dir(real):
            value = getattr(real, name)
            if name.startswith("_") or not isinstance(value, enum.EnumMeta):
                continue
            ours = getattr(module, name)
            assert {k: int(v) for k, v in ours.__members__.items()} == {
                k: int(v) for k, v in value.__members__.items()
            }, name


def test_device_prop_fields_in_hip_pythons_order() -> None:
    real_hip, _ = _real()
    assert list(FIELDS) == real_hip.hipDeviceProp_t().PROPERTIES()  # type: ignore[attr-defined]
    assert hip.hipDeviceProp_t().PROPERTIES() == list(FIELDS)


def test_served_signatures_take_hip_pythons_arguments() -> None:
    """Each served function accepts hip-python's parameter names positionally in order."""
    import inspect

    real_hip, real_rtc = _real()
    for module, real in ((hip, real_hip), (hiprtc, real_rtc)):
        for name in module.__all__:
            fn = getattr(module, name)
            if not inspect.isfunction(fn) or not hasattr(real, name):
                continue
            theirs = list(inspect.signature(getattr(real, name)).parameters)
            ours = list(inspect.signature(fn).parameters)
            if name == "hipGetDeviceProperties":
                continue  # both of hip-python's forms are served: (props, device) and (device)
            assert ours == theirs, (name, ours, theirs)
