"""GPU backends and how the worker picks one.

``hip`` (hip-python, AMD), ``cuda`` (cuda-bindings, NVIDIA) and ``emulator`` (host
memory) all implement :class:`hipr.backends.interface.Backend`. Their modules are imported
only when asked for, because hip-python and cuda-bindings are optional extras and a
worker on one vendor's node never needs the other's library.
"""

from __future__ import annotations

from typing import Any

import structlog

from hipr.backends.interface import Backend, BackendUnavailable
from hipr.errors import HipErrorCode

__all__ = ["BACKEND_NAMES", "BackendUnavailable", "load_backend"]

#: What :func:`load_backend` accepts.
BACKEND_NAMES: tuple[str, ...] = ("hip", "cuda", "emulator", "auto")

_log = structlog.get_logger("hipr.backends")


def load_backend(name: str, /, *, fallback: bool = True, **emulator_options: Any) -> Backend:
    """The backend called ``name``: ``"hip"``, ``"cuda"``, ``"emulator"`` or ``"auto"``.

    ``"auto"`` tries hip, then cuda, then the emulator, returns the first that loads
    and logs which it chose and why each one before it was skipped. ``emulator_options``
    go to ``EmulatorBackend`` (``device_count``, ``total_memory``, ``name``) and are
    ignored by the GPU backends, which describe the real device.

    ``name`` is positional-only because the emulator takes a ``name`` option too.
    ``fallback=False`` makes ``"auto"`` raise :class:`BackendUnavailable` instead of
    falling back to the emulator (a GPU node must not silently serve host memory); the
    fallback itself is logged as a warning.

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
    why = "; ".join(f"{k}: {v}" for k, v in skipped.items())
    if not fallback:
        raise BackendUnavailable(
            HipErrorCode.hipErrorNoDevice,
            f"--backend auto found no GPU runtime ({why}) and the emulator fallback is off: "
            "install hipr[hip] or hipr[cuda] on a GPU node, or choose --backend emulator",
        )
    backend = _load_emulator(emulator_options)
    # A warning: on a GPU node without the extra a user would otherwise get host memory
    # and numpy kernels without noticing.
    _log.warning(
        "backend selected",
        backend="emulator",
        requested="auto",
        skipped=skipped,
        fallback="no GPU runtime loaded: serving the EMULATOR (host memory, built-in "
        "kernels only); install hipr[hip] or hipr[cuda], or refuse with "
        "--no-emulator-fallback (emulator_fallback = false)",
    )
    return backend


def _load_hip() -> Backend:
    from hipr.backends.hip_backend import HipBackend

    return HipBackend()


def _load_cuda() -> Backend:
    from hipr.backends.cuda_backend import CudaBackend

    return CudaBackend()


def _load_emulator(options: dict[str, Any]) -> Backend:
    from hipr.backends.emulator import EmulatorBackend

    backend: Backend = EmulatorBackend(**options)
    return backend
