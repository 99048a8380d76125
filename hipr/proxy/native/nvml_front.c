/* A minimal libnvidia-ml.so.1 for programs run through the CUDA proxy: the NVML calls
 * PyTorch resolves at start-up and the basic device queries (count, handles, name, UUID,
 * PCI address, memory, compute capability, CUDA version), answered from the worker
 * through the proxy's own libcuda.so.1, so that no call reaches this host's driver. What
 * the worker cannot tell (processes, NVLink, fabric, the kernel driver's version) returns
 * NVML_ERROR_NOT_SUPPORTED. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_types.h"

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_UNKNOWN 999

#define MAX_DEVICES 64

typedef struct nvml_device {
    int index;
} *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *ctx);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total);

static struct nvml_device devices[MAX_DEVICES];
static int initialized; /* nvmlInit calls not yet shut down */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static nvmlReturn_t from_cu(CUresult rc) {
    switch (rc) {
    case CUDA_SUCCESS:
        return NVML_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE:
        return NVML_ERROR_INVALID_ARGUMENT;
    case CUDA_ERROR_NO_DEVICE:
        return NVML_ERROR_DRIVER_NOT_LOADED; /* no worker answered */
    case CUDA_ERROR_NOT_SUPPORTED:
        return NVML_ERROR_NOT_SUPPORTED;
    default:
        return NVML_ERROR_UNKNOWN;
    }
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags; /* NO_GPUS / NO_ATTACH: nothing is attached here anyway */
    nvmlReturn_t rc = from_cu(cuInit(0));
    if (rc == NVML_SUCCESS) {
        pthread_mutex_lock(&lock);
        initialized++;
        for (int i = 0; i < MAX_DEVICES; i++) devices[i].index = i;
        pthread_mutex_unlock(&lock);
    }
    return rc;
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = initialized ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (initialized) initialized--;
    pthread_mutex_unlock(&lock);
    return rc;
}

static int ready(void) {
    pthread_mutex_lock(&lock);
    int ok = initialized > 0;
    pthread_mutex_unlock(&lock);
    return ok;
}

API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case NVML_ERROR_NOT_FOUND:
        return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
        return "Driver Not Loaded";
    default:
        return "Unknown Error";
    }
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!ready()) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    int n = 0;
    nvmlReturn_t rc = from_cu(cuDeviceGetCount(&n));
    if (rc == NVML_SUCCESS) *count = (unsigned)(n < MAX_DEVICES ? n : MAX_DEVICES);
    return rc;
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

static nvmlReturn_t device_index(nvmlDevice_t d, int *index) {
    if (!ready()) return NVML_ERROR_UNINITIALIZED;
    if (!d || d < devices || d >= devices + MAX_DEVICES) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned count = 0;
    nvmlReturn_t rc = nvmlDeviceGetCount_v2(&count);
    if (rc) return rc;
    if ((unsigned)d->index >= count) return NVML_ERROR_INVALID_ARGUMENT;
    *index = d->index;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!ready()) return NVML_ERROR_UNINITIALIZED;
    unsigned count = 0;
    nvmlReturn_t rc = nvmlDeviceGetCount_v2(&count);
    if (rc) return rc;
    if (!device || index >= count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    int i;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = device_index(d, &i);
    if (rc == NVML_SUCCESS) *index = (unsigned)i;
    return rc;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    int i;
    if (!name || !length) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = device_index(d, &i);
    char buf[256];
    if (rc == NVML_SUCCESS) rc = from_cu(cuDeviceGetName(buf, sizeof buf, i));
    if (rc) return rc;
    if (strlen(buf) >= length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(name, buf, strlen(buf) + 1);
    return NVML_SUCCESS;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" of the device's UUID as the proxy names it. */
static nvmlReturn_t uuid_text(int i, char *out, size_t size) {
    CUuuid u;
    nvmlReturn_t rc = from_cu(cuDeviceGetUuid_v2(&u, i));
    if (rc) return rc;
    const unsigned char *b = (const unsigned char *)u.bytes;
    snprintf(out, size,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    int i;
    if (!uuid || !length) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = device_index(d, &i);
    char buf[80];
    if (rc == NVML_SUCCESS) rc = uuid_text(i, buf, sizeof buf);
    if (rc) return rc;
    if (strlen(buf) >= length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(uuid, buf, strlen(buf) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t pci_of(int i, nvmlPciInfo_t *pci) {
    int domain = 0, bus = 0, dev = 0, id = 0, sub = 0;
    nvmlReturn_t rc = from_cu(cuDeviceGetAttribute(&domain, 50, i));
    if (rc == NVML_SUCCESS) rc = from_cu(cuDeviceGetAttribute(&bus, 33, i));
    if (rc == NVML_SUCCESS) rc = from_cu(cuDeviceGetAttribute(&dev, 34, i));
    if (rc) return rc;
    /* The PCI device and subsystem ids, where the worker's driver reports them. */
    if (cuDeviceGetAttribute(&id, 139, i) != CUDA_SUCCESS) id = 0;
    if (cuDeviceGetAttribute(&sub, 140, i) != CUDA_SUCCESS) sub = 0;
    memset(pci, 0, sizeof *pci);
    pci->domain = (unsigned)domain;
    pci->bus = (unsigned)bus;
    pci->device = (unsigned)dev;
    pci->pciDeviceId = (unsigned)id;
    pci->pciSubSystemId = (unsigned)sub;
    snprintf(pci->busId, sizeof pci->busId, "%08x:%02x:%02x.0", pci->domain & 0xffffffffu,
             pci->bus & 0xffu, pci->device & 0x1fu);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.0",
             pci->domain & 0xffffu, pci->bus & 0xffu, pci->device & 0x1fu);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    int i;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = device_index(d, &i);
    return rc ? rc : pci_of(i, pci);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(d, pci);
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    if (!ready()) return NVML_ERROR_UNINITIALIZED;
    if (!bus_id || !device) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned domain = 0, bus = 0, dev = 0;
    if (sscanf(bus_id, "%x:%x:%x", &domain, &bus, &dev) != 3) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned count = 0;
    nvmlReturn_t rc = nvmlDeviceGetCount_v2(&count);
    for (unsigned i = 0; rc == NVML_SUCCESS && i < count; i++) {
        nvmlPciInfo_t pci;
        rc = pci_of((int)i, &pci);
        if (rc == NVML_SUCCESS && pci.domain == domain && pci.bus == bus && pci.device == dev) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return rc ? rc : NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!ready()) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned count = 0;
    nvmlReturn_t rc = nvmlDeviceGetCount_v2(&count);
    for (unsigned i = 0; rc == NVML_SUCCESS && i < count; i++) {
        char text[80];
        rc = uuid_text((int)i, text, sizeof text);
        if (rc == NVML_SUCCESS && strcmp(text, uuid) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return rc ? rc : NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *memory) {
    int i;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = device_index(d, &i);
    if (rc) return rc;
    /* The device's figures as the worker's driver gives them, through its primary
     * context (retained for the question, released after). */
    CUcontext ctx = NULL, popped = NULL;
    size_t free_bytes = 0, total = 0;
    rc = from_cu(cuDevicePrimaryCtxRetain(&ctx, i));
    if (rc) return rc;
    rc = from_cu(cuCtxPushCurrent_v2(ctx));
    if (rc == NVML_SUCCESS) {
        rc = from_cu(cuMemGetInfo_v2(&free_bytes, &total));
        cuCtxPopCurrent_v2(&popped);
    }
    cuDevicePrimaryCtxRelease_v2(i);
    if (rc) return rc;
    memory->total = total;
    memory->free = free_bytes;
    memory->used = total - free_bytes;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    int i;
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = device_index(d, &i);
    if (rc == NVML_SUCCESS) rc = from_cu(cuDeviceGetAttribute(major, 75, i));
    if (rc == NVML_SUCCESS) rc = from_cu(cuDeviceGetAttribute(minor, 76, i));
    return rc;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    return from_cu(cuDriverGetVersion(version));
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    return nvmlSystemGetCudaDriverVersion_v2(version);
}

/* What the worker does not report: refused, and named once on stderr. */
#define UNSERVED(name, params)                                                          \
    API nvmlReturn_t name params {                                                      \
        static int warned;                                                              \
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))                         \
            fprintf(stderr, "hipr proxy: " #name " is not served (NVML_ERROR_NOT_SUPPORTED)\n"); \
        return NVML_ERROR_NOT_SUPPORTED;                                                \
    }

#pragma GCC diagnostic ignored "-Wunused-parameter"
UNSERVED(nvmlSystemGetDriverVersion, (char *version, unsigned int length))
UNSERVED(nvmlDeviceGetComputeRunningProcesses, (nvmlDevice_t d, unsigned int *count, void *infos))
UNSERVED(nvmlDeviceGetComputeRunningProcesses_v3, (nvmlDevice_t d, unsigned int *count, void *infos))
UNSERVED(nvmlDeviceGetNvLinkRemoteDeviceType, (nvmlDevice_t d, unsigned int link, int *type))
UNSERVED(nvmlDeviceGetNvLinkRemotePciInfo_v2, (nvmlDevice_t d, unsigned int link, void *pci))
UNSERVED(nvmlDeviceGetGpuFabricInfoV, (nvmlDevice_t d, void *info))
UNSERVED(nvmlDeviceGetUtilizationRates, (nvmlDevice_t d, void *utilization))
UNSERVED(nvmlDeviceGetPowerUsage, (nvmlDevice_t d, unsigned int *power))
UNSERVED(nvmlDeviceGetTemperature, (nvmlDevice_t d, int sensor, unsigned int *temp))
UNSERVED(nvmlDeviceGetClockInfo, (nvmlDevice_t d, int type, unsigned int *clock))
