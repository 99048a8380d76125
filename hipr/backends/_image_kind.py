"""Which GPU vendor a code object is for, read from its first bytes, so that a worker
refuses a module built for the other vendor's GPUs with a clear error instead of handing
it to a runtime that fails obscurely (or, for some drivers, worse)."""

from __future__ import annotations

import struct

from hipr.errors import HipError, HipErrorCode

#: ELF e_machine values of GPU code objects.
_EM_CUDA = 190
_EM_AMDGPU = 224
_CUDA_FATBIN = 0xBA55ED50
_CUDA_FATBIN_WRAPPER = 0x466243B1


def image_vendor(image: bytes | bytearray | memoryview) -> str | None:
    """ "nvidia" for a CUBIN, CUDA fat binary or PTX text; "amd" for an AMDGPU ELF code
    object or a clang offload bundle (plain or compressed); None when it cannot tell."""
    head = bytes(image[:64])
    if head.startswith(b"\x7fELF") and len(head) >= 20:
        machine = struct.unpack_from("<H", head, 18)[0]
        return {_EM_CUDA: "nvidia", _EM_AMDGPU: "amd"}.get(machine)
    if head.startswith((b"__CLANG_OFFLOAD_BUNDLE__", b"CCOB")):
        return "amd"
    if len(head) >= 4 and struct.unpack_from("<I", head)[0] in (_CUDA_FATBIN, _CUDA_FATBIN_WRAPPER):
        return "nvidia"
    text = head.lstrip()
    if text.startswith((b"//", b".version", b".target")) and (
        b".target sm_" in bytes(image[:4096]) or b".version" in bytes(image[:4096])
    ):
        return "nvidia"
    return None


#: The vendor whose code objects each GPU runtime loads.
_RUNTIME_VENDOR = {"cuda": "nvidia", "hip": "amd"}
_NAMES = {"nvidia": "an NVIDIA (CUDA) binary", "amd": "an AMD GPU code object"}
_FIX = {
    "nvidia": "compile it for NVIDIA GPUs (a cubin, PTX or fat binary, e.g. nvcc or NVRTC)",
    "amd": "compile it for AMD GPUs (an HSACO or offload bundle, e.g. hipcc --genco)",
}


def check_image(runtime: str, image: bytes | bytearray | memoryview) -> None:
    """Raise hipErrorNoBinaryForGpu when ``image`` is for the other vendor's GPUs than
    ``runtime`` ("cuda" or "hip") runs; images it cannot classify are left to the runtime."""
    want = _RUNTIME_VENDOR.get(runtime)
    got = image_vendor(image)
    if want is None or got is None or got == want:
        return
    raise HipError(
        HipErrorCode.hipErrorNoBinaryForGpu,
        f"this worker runs {'NVIDIA' if want == 'nvidia' else 'AMD'} GPUs ({runtime} backend) "
        f"and the module is {_NAMES[got]}: {_FIX[want]}",
    )
