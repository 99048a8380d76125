"""The one exception family of hipr, carrying HIP's own ``hipError_t`` codes.

Every failure a user can see, local or remote, is a :class:`HipError`. Its ``code`` is
the numeric ``hipError_t`` that HIP itself would return, so code written against HIP's
error values keeps working; ``kind`` says which family it is on the wire, so that a
client can rebuild the right subclass from a worker's error reply.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, ClassVar


class HipErrorCode(IntEnum):
    """``hipError_t`` values, identical to HIP's (checked against hip-python's enum)."""

    hipSuccess = 0
    hipErrorInvalidValue = 1
    hipErrorOutOfMemory = 2
    hipErrorNotInitialized = 3
    hipErrorDeinitialized = 4
    hipErrorInvalidConfiguration = 9
    hipErrorInvalidSymbol = 13
    hipErrorInvalidDevicePointer = 17
    hipErrorInvalidMemcpyDirection = 21
    hipErrorInsufficientDriver = 35
    hipErrorMissingConfiguration = 52
    hipErrorPriorLaunchFailure = 53
    hipErrorInvalidDeviceFunction = 98
    hipErrorNoDevice = 100
    hipErrorInvalidDevice = 101
    hipErrorInvalidImage = 200
    hipErrorInvalidContext = 201
    hipErrorContextAlreadyCurrent = 202
    hipErrorMapFailed = 205
    hipErrorUnmapFailed = 206
    hipErrorNoBinaryForGpu = 209
    hipErrorUnsupportedLimit = 215
    hipErrorPeerAccessUnsupported = 217
    hipErrorInvalidKernelFile = 218
    hipErrorInvalidSource = 300
    hipErrorFileNotFound = 301
    hipErrorSharedObjectSymbolNotFound = 302
    hipErrorSharedObjectInitFailed = 303
    hipErrorOperatingSystem = 304
    hipErrorInvalidHandle = 400
    hipErrorIllegalState = 401
    hipErrorNotFound = 500
    hipErrorNotReady = 600
    hipErrorIllegalAddress = 700
    hipErrorLaunchOutOfResources = 701
    hipErrorLaunchTimeOut = 702
    hipErrorPeerAccessAlreadyEnabled = 704
    hipErrorPeerAccessNotEnabled = 705
    hipErrorSetOnActiveProcess = 708
    hipErrorContextIsDestroyed = 709
    hipErrorAssert = 710
    hipErrorHostMemoryAlreadyRegistered = 712
    hipErrorHostMemoryNotRegistered = 713
    hipErrorLaunchFailure = 719
    hipErrorCooperativeLaunchTooLarge = 720
    hipErrorNotSupported = 801
    hipErrorStreamCaptureUnsupported = 900
    hipErrorStreamCaptureInvalidated = 901
    hipErrorStreamCaptureMerge = 902
    hipErrorStreamCaptureUnmatched = 903
    hipErrorStreamCaptureUnjoined = 904
    hipErrorStreamCaptureIsolation = 905
    hipErrorStreamCaptureImplicit = 906
    hipErrorCapturedEvent = 907
    hipErrorStreamCaptureWrongThread = 908
    hipErrorGraphExecUpdateFailure = 910
    hipErrorUnknown = 999
    hipErrorRuntimeMemory = 1052
    hipErrorRuntimeOther = 1053


def error_name(code: int) -> str:
    """HIP's name for ``code``, or ``hipErrorUnknown(<code>)`` for a value HIP lacks."""
    try:
        return HipErrorCode(code).name
    except ValueError:
        return f"hipErrorUnknown({code})"


class HipError(Exception):
    """A HIP failure: ``code`` is the ``hipError_t`` value, ``name`` its HIP name."""

    kind: ClassVar[str] = "hip"
    default_code: ClassVar[int] = HipErrorCode.hipErrorUnknown

    def __init__(self, code: int | None = None, message: str = "", **details: Any) -> None:
        self.code = int(self.default_code if code is None else code)
        self.message = message
        self.details = details
        super().__init__(self.code, message)

    @property
    def name(self) -> str:
        """HIP's name for :attr:`code`, e.g. ``"hipErrorOutOfMemory"``."""
        return error_name(self.code)

    def __str__(self) -> str:
        return f"{self.name} ({self.code}): {self.message}" if self.message else self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code}, {self.message!r})"

    def to_wire(self) -> dict[str, Any]:
        """The CBOR map an error reply carries."""
        wire: dict[str, Any] = {"code": self.code, "kind": self.kind, "message": self.message}
        if self.details:
            wire["details"] = self.details
        return wire

    @staticmethod
    def from_wire(obj: object) -> HipError:
        """Rebuild the error of a worker's error reply; a malformed reply is a protocol error."""
        if not isinstance(obj, dict) or not isinstance(obj.get("code"), int):
            return ProtocolError(message=f"malformed error reply from the worker: {obj!r:.200}")
        cls = _KINDS.get(str(obj.get("kind", "hip")), HipError)
        details = obj.get("details")
        err = cls(obj["code"], str(obj.get("message", "")))
        if isinstance(details, dict):
            err.details = details
        return err


class ProtocolError(HipError):
    """The peer broke the wire protocol: bad magic, oversized frame, malformed payload."""

    kind = "protocol"
    default_code = HipErrorCode.hipErrorInvalidValue


class VersionMismatchError(ProtocolError):
    """Client and worker speak protocol versions of different major numbers."""

    kind = "version"
    default_code = HipErrorCode.hipErrorNotSupported


class AuthError(HipError):
    """The worker refused the credentials: a missing, wrong or revoked token."""

    kind = "auth"
    default_code = HipErrorCode.hipErrorNotInitialized


class QuotaError(HipError):
    """A tenant quota other than device memory was reached; ``details`` name it."""

    kind = "quota"
    default_code = HipErrorCode.hipErrorOutOfMemory


class UsageError(HipError, ValueError):
    """The caller asked for something malformed: a bad URL, option or argument.

    Also a :class:`ValueError`, which is what such mistakes raised before, so
    ``except ValueError`` keeps working."""

    kind = "usage"
    default_code = HipErrorCode.hipErrorInvalidValue

    def __str__(self) -> str:
        # What is wrong and how to fix it; the HIP code is no help for a typo.
        return self.message or super().__str__()


class InvalidUrlError(UsageError):
    """A worker URL that cannot be used: unknown scheme, no scheme, bad port, relative
    unix path. The message names the URL and shows a well-formed one."""

    kind = "invalid_url"


class HipConnectionError(HipError):
    """The link to the worker failed: refused, reset, or closed mid-request."""

    kind = "connection"
    default_code = HipErrorCode.hipErrorNotInitialized


class HipTimeoutError(HipConnectionError):
    """A call did not complete within its timeout."""

    kind = "timeout"
    default_code = HipErrorCode.hipErrorLaunchTimeOut


class SessionLostError(HipConnectionError):
    """The worker no longer holds this session; its handles are invalid."""

    kind = "session_lost"
    default_code = HipErrorCode.hipErrorContextIsDestroyed


class ContextLostError(SessionLostError):
    """A kernel's fault poisoned the GPU context this session ran in (an illegal address,
    a launch failure, a hardware exception): everything the session held on the device
    is gone. ``code`` is the fault's own ``hipError_t`` (e.g. hipErrorIllegalAddress);
    ``details["cause"]`` is the runtime's message. The link is fine and a new session
    works: the worker rebuilt the context, or restarted the tenant's process.

    A subclass of :class:`SessionLostError` (the session is gone, its handles are
    invalid, reconnecting cannot resume it), told apart from a lost link by its type."""

    kind = "context_lost"
    default_code = HipErrorCode.hipErrorIllegalAddress


class RunawayKernelError(QuotaError, SessionLostError):
    """The worker stopped the session's GPU work for running past a time limit (the
    ``max_kernel_seconds`` quota, named with its limit in ``details``), by tearing down
    the context that ran it: the session is gone, as after any :class:`SessionLostError`;
    a new session of the tenant works."""

    kind = "runaway"
    default_code = HipErrorCode.hipErrorLaunchTimeOut


_KINDS: dict[str, type[HipError]] = {
    cls.kind: cls
    for cls in (
        HipError,
        ProtocolError,
        VersionMismatchError,
        AuthError,
        QuotaError,
        UsageError,
        InvalidUrlError,
        HipConnectionError,
        HipTimeoutError,
        SessionLostError,
        ContextLostError,
        RunawayKernelError,
    )
}


def invalid_value(message: str) -> HipError:
    """Shorthand for the commonest refusal."""
    return HipError(HipErrorCode.hipErrorInvalidValue, message)
