"""GPU backends and how the worker picks one.

``hip`` (hip-python, AMD), ``cuda`` (cuda-bindings, NVIDIA) and ``emulator`` (host
memory) all implement :class:`hipr.backends.base.Backend`. Their modules are imported
only when asked for, because hip-python and cuda-bindings are optional extras and a
worker on one vendor's node never needs the other's library.
"""

from __future__ import annotations

from typing import Any, ClassVar

import structlog

from hipr.backends.base import Backend
from hipr.errors import HipError, HipErrorCode

__all__ = ["BACKEND_NAMES", "BackendUnavailable", "load_backend"]

#: What :func:`load_backend` accepts.
BACKEND_NAMES: tuple[str, ...] = ("hip", "cuda", "emulator", "auto")

_log = structlog.get_logger("hipr.backends")


class BackendUnavailable(HipError):
    """A backend's runtime could not be loaded here: its Python package or native
    library is missing, the driver is too old, or it sees no device. The message is one
    line naming the library, e.g. ``cuda backend unavailable: could not load
    libcuda.so.1 (...)``; ``details["library"]`` names it too."""

    kind: ClassVar[str] = "backend_unavailable"
    default_code: ClassVar[int] = HipErrorCode.hipErrorNoDevice

    def __init__(self, code: int | None = None, message: str = "", **details: Any) -> None:
        # One line: this text ends up in logs and CLI errors, where a multi-line
        # loader traceback would bury the library's name.
        super().__init__(code, " ".join(message.split()), **details)

    @property
    def library(self) -> str:
        """The library (or package) that could not be used."""
        return str(self.details.get("library", ""))


def load_backend(name: str, /, **emulator_options: Any) -> Backend:
    """The backend called ``name``: ``"hip"``, ``"cuda"``, ``"emulator"`` or ``"auto"``.

    ``"auto"`` tries hip, then cuda, then the emulator, returns the first that loads
    and logs which it chose and why each one before it was skipped. ``emulator_options``
    go to ``EmulatorBackend`` (``device_count``, ``total_memory``, ``name``) and are
    ignored by the GPU backends, which describe the real device.

    ``name`` is positional-only because the emulator takes a ``name`` option too.

    Raises :class:`BackendUnavailable` when an explicitly named GPU backend cannot
    load, and ValueError for a name not in :data:`BACKEND_NAMES`.
    """
    if name not in BACKEND_NAMES:
        raise ValueError(
            f"unknown backend {name!r}: choose one of {', '.join(repr(n) for n in BACKEND_NAMES)}"
        )
    if name == "hip":
        return _load_hip()
    if name == "cuda":
        return _load_cuda()
    if name == "emulator":
        return _load_emulator(emulator_options)

    skipped: dict[str, str] = {}
    for candidate, loader in (("hip", _load_hip), ("cuda", _load_cuda)):
        try:
            backend = loader()
        except BackendUnavailable as exc:
            skipped[candidate] = exc.message
            continue
        _log.info("backend selected", backend=candidate, requested="auto", skipped=skipped)
        return backend
    backend = _load_emulator(emulator_options)
    _log.info("backend selected", backend="emulator", requested="auto", skipped=skipped)
    return backend


def _load_hip() -> Backend:
    from hipr.backends.hip import HipBackend

    return HipBackend()


def _load_cuda() -> Backend:
    from hipr.backends.cuda import CudaBackend

    return CudaBackend()


def _load_emulator(options: dict[str, Any]) -> Backend:
    from hipr.backends.emulator import EmulatorBackend

    backend: Backend = EmulatorBackend(**options)
    return backend
