"""NVML (pynvml, which loads libnvidia-ml.so.1) through the proxy's minimal NVML: device
count, name, UUID, memory, PCI address, compute capability, CUDA version; what the worker
cannot tell is refused. Prints one fact per line, and the NVIDIA libraries mapped."""

import pynvml as nvml

nvml.nvmlInit()
handle = nvml.nvmlDeviceGetHandleByIndex(0)
print("count", nvml.nvmlDeviceGetCount())
print("name", nvml.nvmlDeviceGetName(handle))
uuid = nvml.nvmlDeviceGetUUID(handle)
print("uuid", uuid.startswith("GPU-") and len(uuid) == 40)
memory = nvml.nvmlDeviceGetMemoryInfo(handle)
print("memory", memory.total > 0 and memory.used == memory.total - memory.free)
print("pci", nvml.nvmlDeviceGetPciInfo(handle).busId)
print("by uuid", nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(uuid)))
print("cuda", nvml.nvmlSystemGetCudaDriverVersion())
try:
    nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    print("processes served")
except nvml.NVMLError as exc:
    print("processes", exc)
nvml.nvmlShutdown()
with open("/proc/self/maps") as maps:
    names = {line.split()[-1] for line in maps if "libnvidia-ml" in line or "libcuda" in line}
print("mapped", sorted(names))
