"""hip-python's hiprtc linking through the proxy prints what ``hipr.hiprtc`` prints for
the same program (tests/proxy/link_program.py). On the emulator both get the compile and
the link refused (it has neither compiler nor linker), through the same calls, results
and log sizes; scripts/proxy-gpu-front runs the same pair on a cuda worker, where the two
programs link and run."""

from __future__ import annotations

from tests.proxy.conftest import run_python
from tests.proxy.link_program import PROGRAM


def test_hip_python_and_hipr_link_alike(proxy_libs: None, worker_url: str) -> None:
    proxied = run_python(PROGRAM.replace("IMPORT", "from hip import hip, hiprtc"), url=worker_url)
    direct = run_python(
        PROGRAM.replace("IMPORT", "from hipr import hip, hiprtc"), url=worker_url, proxied=False
    )
    assert proxied.returncode == 0, proxied.stderr
    assert direct.returncode == 0, direct.stderr
    assert proxied.stdout == direct.stdout
    lines = proxied.stdout.splitlines()
    assert "link add helper HIPRTC_SUCCESS" in lines
    assert "link complete HIPRTC_ERROR_INTERNAL_ERROR -" in lines
    assert lines[-1] == "without helper True"
    assert "no device linker" in proxied.stderr


HIP_LINK = r"""
from hip import hiprtc
from hipr.backends._link import hip_link
from hipr.errors import HipError
try:
    hip_link(hiprtc, [(100, b"BC\xc0\xde" + bytes(60), "a.bc"), (1, b"//\n.version 8.0\n", "b")])
except HipError as e:
    print(e.details["rtc_result"], e.message.splitlines()[0])
"""


def test_the_hip_backends_link_calls_fit_hip_python(proxy_libs: None, worker_url: str) -> None:
    """The hip backend's linker (hipr/backends/_link.py) calls hip-python's real hiprtc
    bindings, here bound to the proxy's libhiprtc.so (no AMD GPU at hand): create, both
    inputs added with their types and names, complete reached, the emulator's refusal
    (HIPRTC_ERROR_INTERNAL_ERROR) raised as a HipError."""
    result = run_python(HIP_LINK, url=worker_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "11 hiprtcLinkComplete failed: NVRTC_ERROR_INTERNAL_ERROR (11)"
