"""FUNCTION_PARAMS on the hip backend: the layout comes from the loaded code object's
``amdhsa.kernels`` metadata (hipr.kernels.amdhsa), on the simulated HIP runtime of
test_gpu_backends_nogpu with a synthetic AMDGPU code object (no AMD GPU here)."""

from __future__ import annotations

from typing import Any

import pytest

from hipr.errors import HipError, HipErrorCode
from hipr.kernels.amdhsa import kernel_layouts
from tests.backends.test_gpu_backends_nogpu import HAVE_HIP_PYTHON, SimGpu, make_sim_hip
from tests.kernels.test_amdhsa import SCALE_LAYOUT, code_object

pytestmark = pytest.mark.skipif(not HAVE_HIP_PYTHON, reason="hip-python absent")


def _hip_backend() -> tuple[Any, SimGpu]:
    from hipr.backends.hip_backend import HipBackend

    gpu = SimGpu()
    hip_mod, rtc_mod = make_sim_hip(gpu)
    sim_load = hip_mod._handlers["hipModuleLoadData"]

    def load(image: bytes) -> Any:
        # The simulated runtime takes real AMDGPU ELF code objects too, with the kernels
        # their metadata names.
        if bytes(image).startswith(b"\x7fELF\x02"):
            return {"names": list(kernel_layouts(bytes(image)))}
        return sim_load(image)

    hip_mod._handlers["hipModuleLoadData"] = load
    backend = HipBackend(_hip=hip_mod, _hiprtc=rtc_mod)
    backend.bind_thread(0)
    return backend, gpu


def test_layouts_come_from_the_code_object() -> None:
    backend, _ = _hip_backend()
    try:
        module = backend.module_load(code_object())
        scale = backend.module_get_function(module, "scale_vector")
        print_tid = backend.module_get_function(module, "print_tid")
        assert backend.function_params(scale) == [
            (a.offset, a.size, a.pointer) for a in SCALE_LAYOUT
        ]
        assert backend.function_params(print_tid) == []
        backend.module_unload(module)
        # A module of the simulation's own kind has no metadata: the runtime cannot tell.
        image = backend.compile('extern "C" __global__ void axpy_f32() {}', "k.hip", [])
        other = backend.module_load(image)
        with pytest.raises(HipError) as info:
            backend.function_params(backend.module_get_function(other, "axpy_f32"))
        assert info.value.code == HipErrorCode.hipErrorNotSupported
        backend.module_unload(other)
    finally:
        backend.close()
