"""Which runtime errors poison a GPU context for good ("sticky" errors).

After an illegal address, a failed launch, a device-side assert or a hardware exception,
CUDA and HIP refuse every later call in that context with the same error until the
context is destroyed (``cuDevicePrimaryCtxReset``, ``hipDeviceReset``) or the process
ends. The worker must tell such a failure from an ordinary one: every session of the
context has lost its device state, and the context must be rebuilt before anyone can
use the device again. The backends mark these errors (``details["context_poisoned"]``)
where they convert a runtime's result, so the worker never needs a runtime's tables.
"""

from __future__ import annotations

from hipr.errors import HipError, HipErrorCode

#: ``CUresult`` values that leave the context unusable (the CUDA driver API's own
#: documentation of each says "the context cannot be used, so it must be destroyed").
STICKY_CU_RESULTS: frozenset[int] = frozenset(
    {
        214,  # CUDA_ERROR_ECC_UNCORRECTABLE
        700,  # CUDA_ERROR_ILLEGAL_ADDRESS
        702,  # CUDA_ERROR_LAUNCH_TIMEOUT
        710,  # CUDA_ERROR_ASSERT
        714,  # CUDA_ERROR_HARDWARE_STACK_ERROR
        715,  # CUDA_ERROR_ILLEGAL_INSTRUCTION
        716,  # CUDA_ERROR_MISALIGNED_ADDRESS
        717,  # CUDA_ERROR_INVALID_ADDRESS_SPACE
        718,  # CUDA_ERROR_INVALID_PC
        719,  # CUDA_ERROR_LAUNCH_FAILED
    }
)

#: ``hipError_t`` values a HIP runtime returns for the same faults (ROCm folds the
#: hardware exceptions into hipErrorLaunchFailure / hipErrorIllegalAddress).
STICKY_HIP_CODES: frozenset[int] = frozenset(
    {
        214,  # hipErrorECCNotCorrectable
        int(HipErrorCode.hipErrorIllegalAddress),
        int(HipErrorCode.hipErrorLaunchTimeOut),
        int(HipErrorCode.hipErrorAssert),
        int(HipErrorCode.hipErrorLaunchFailure),
    }
)

#: The key of ``HipError.details`` that marks a context-poisoning error.
MARK = "context_poisoned"


def mark_sticky(error: HipError) -> HipError:
    """``error``, marked as one that poisoned its context."""
    error.details[MARK] = True
    return error


def poisons_context(error: BaseException) -> bool:
    """True when ``error`` came from a runtime call that left its context unusable."""
    return isinstance(error, HipError) and bool(error.details.get(MARK))
