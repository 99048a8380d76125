"""Device telemetry for status pages and metrics: what each GPU is doing right now.

:func:`device_telemetry` asks the management library that matches the backend (NVML
through nvidia-ml-py for ``cuda``, amdsmi for ``hip``) and falls back to what the
backend itself knows (name, total memory; the emulator's own memory figures). It
returns what it can and never raises: a status page must not fail because a
temperature sensor is missing or the management library is not installed.

Devices are matched to the management library's by PCI bus id, not by index: CUDA's
and HIP's device order (and ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES``) need
not agree with NVML's or amdsmi's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import structlog

from hipr.backends.interface import Backend

log = structlog.get_logger("hipr.telemetry")


@dataclass(frozen=True, slots=True)
class DeviceTelemetry:
    """One device's live figures; ``None`` where the runtime does not tell."""

    index: int
    name: str = ""
    pci_bus_id: str = ""
    memory_used: int | None = None
    memory_total: int | None = None
    #: Percent of time the compute engine was busy over the library's last sample.
    utilization: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    #: Where the figures came from: ``nvml``, ``amdsmi``, ``emulator`` or ``runtime``.
    source: str = "runtime"

    def to_wire(self) -> dict[str, Any]:
        """A CBOR- and JSON-friendly map."""
        return asdict(self)


def device_telemetry(backend: Backend) -> list[DeviceTelemetry]:
    """Live figures of every device of ``backend``; never raises.

    May block for a few milliseconds (management libraries read sysfs or talk to a
    driver): call it from a worker thread, not the event loop.
    """
    try:
        base = _runtime_figures(backend)
        if backend.name == "cuda":
            return _merge(base, _nvml_figures, "nvml")
        if backend.name == "hip":
            return _merge(base, _amdsmi_figures, "amdsmi")
        if backend.name == "emulator":
            return _emulator_figures(backend, base)
        return base
    except Exception as exc:  # never raise: a status page must still render
        log.debug("device telemetry failed", error=repr(exc))
        return []


def normalise_bus_id(bus_id: str) -> str:
    """``"00000000:0A:00.0"`` and ``"0000:0a:00.0"`` both become ``"0000:0a:00.0"``."""
    text = bus_id.strip().lower()
    try:
        domain, bus, rest = text.split(":")
        device, function = rest.split(".")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16)}"
    except ValueError:
        return text


def _runtime_figures(backend: Backend) -> list[DeviceTelemetry]:
    out = []
    for index in range(backend.device_count()):
        try:
            props = backend.device_properties(index)
        except Exception:
            out.append(DeviceTelemetry(index))
            continue
        out.append(
            DeviceTelemetry(
                index,
                name=props.name,
                pci_bus_id=props.pci_bus_id,
                memory_total=props.total_memory,
            )
        )
    return out


def _merge(
    base: list[DeviceTelemetry],
    query: Callable[[], dict[str, dict[str, Any]]],
    source: str,
) -> list[DeviceTelemetry]:
    """``base`` with the figures ``query`` returns by normalised bus id laid over it."""
    try:
        by_bus = query()
    except Exception as exc:
        log.debug("management library unavailable", source=source, error=repr(exc))
        return base
    merged = []
    for device in base:
        figures = by_bus.get(normalise_bus_id(device.pci_bus_id))
        if figures is None and len(by_bus) == len(base) == 1:
            figures = next(iter(by_bus.values()))  # one device each side: no doubt
        merged.append(replace(device, source=source, **figures) if figures else device)
    return merged


def _number(value: Any) -> float | None:
    """``value`` as a float, or None for the libraries' "N/A" and the like."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _quietly(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None when the device does not support the query."""
    try:
        return fn(*args)
    except Exception:
        return None


# --- NVML (NVIDIA) ---------------------------------------------------------------------

_nvml_lock = threading.Lock()
_nvml_ready = False


@contextlib.contextmanager
def _nvml() -> Iterator[Any]:
    """pynvml, initialised once for the life of the process (nvmlInit is costly)."""
    global _nvml_ready
    import pynvml

    with _nvml_lock:
        if not _nvml_ready:
            pynvml.nvmlInit()
            _nvml_ready = True
    yield pynvml


def _nvml_figures() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    with _nvml() as nv:
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            pci = _quietly(nv.nvmlDeviceGetPciInfo, handle)
            bus_id = getattr(pci, "busId", b"") if pci is not None else b""
            if isinstance(bus_id, bytes):
                bus_id = bus_id.decode("ascii", "replace")
            figures: dict[str, Any] = {}
            memory = _quietly(nv.nvmlDeviceGetMemoryInfo, handle)
            if memory is not None:
                figures["memory_used"] = int(memory.used)
                figures["memory_total"] = int(memory.total)
            rates = _quietly(nv.nvmlDeviceGetUtilizationRates, handle)
            if rates is not None:
                figures["utilization"] = _number(rates.gpu)
            temperature = _quietly(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
            figures["temperature_c"] = _number(temperature)
            milliwatts = _number(_quietly(nv.nvmlDeviceGetPowerUsage, handle))
            figures["power_w"] = None if milliwatts is None else milliwatts / 1000.0
            out[normalise_bus_id(str(bus_id))] = figures
    return out


# --- amdsmi (AMD) ----------------------------------------------------------------------

_amdsmi_lock = threading.Lock()
_amdsmi_ready = False


def _amdsmi_figures() -> dict[str, dict[str, Any]]:
    global _amdsmi_ready
    import amdsmi

    with _amdsmi_lock:
        if not _amdsmi_ready:
            amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
            _amdsmi_ready = True
    out: dict[str, dict[str, Any]] = {}
    for handle in amdsmi.amdsmi_get_processor_handles():
        bus_id = str(_quietly(amdsmi.amdsmi_get_gpu_device_bdf, handle) or "")
        figures: dict[str, Any] = {}
        vram = _quietly(amdsmi.amdsmi_get_gpu_vram_usage, handle)
        if isinstance(vram, dict):
            # amdsmi reports VRAM in MiB.
            used, total = _number(vram.get("vram_used")), _number(vram.get("vram_total"))
            if used is not None:
                figures["memory_used"] = int(used) << 20
            if total is not None:
                figures["memory_total"] = int(total) << 20
        activity = _quietly(amdsmi.amdsmi_get_gpu_activity, handle)
        if isinstance(activity, dict):
            figures["utilization"] = _number(activity.get("gfx_activity"))
        temperature = None
        for sensor in ("HOTSPOT", "EDGE"):
            temperature = _number(
                _quietly(
                    amdsmi.amdsmi_get_temp_metric,
                    handle,
                    getattr(amdsmi.AmdSmiTemperatureType, sensor),
                    amdsmi.AmdSmiTemperatureMetric.CURRENT,
                )
            )
            if temperature is not None:
                break
        figures["temperature_c"] = temperature
        power = _quietly(amdsmi.amdsmi_get_power_info, handle)
        if isinstance(power, dict):
            # MI300 reports only the average; older parts the current socket power.
            watts = _number(power.get("current_socket_power"))
            figures["power_w"] = (
                watts if watts is not None else _number(power.get("average_socket_power"))
            )
        out[normalise_bus_id(bus_id)] = figures
    return out


# --- emulator --------------------------------------------------------------------------


def _emulator_figures(backend: Backend, base: list[DeviceTelemetry]) -> list[DeviceTelemetry]:
    """The emulator's own bookkeeping: memory used per device; no sensors to read."""
    out = []
    for device in base:
        try:
            # The emulator's current device is per thread and binding is free: ask on
            # this thread (never done for real runtimes, where binding makes contexts).
            backend.bind_thread(device.index)
            free, total = backend.mem_get_info()
        except Exception:
            out.append(replace(device, source="emulator"))
            continue
        out.append(replace(device, memory_used=total - free, memory_total=total, source="emulator"))
    return out
