/*
 * Simulated libnvidia-ml: the NVML entry points container tooling and
 * nvidia-smi use, answering from a topology compiled in (simtopo_data.h).
 *
 * Like the real library in a container, it shows only the GPUs whose
 * <root>/dev/nvidia<minor> exists (renumbered from 0), MIG devices only when
 * both of their <root>/dev/nvidia-caps nodes exist, and fails to initialize
 * without <root>/dev/nvidiactl. <root> is where this library is installed:
 * its own path minus the library directory (found with dladdr), so a copy
 * under DIR/usr/lib/x86_64-linux-gnu (aarch64-linux-gnu) looks at DIR/dev and
 * one mounted there inside a container at the container's /dev.
 *
 * Handles point into static tables and are checked before use: a bad
 * handle is NVML_ERROR_INVALID_ARGUMENT, never a crash.
 * NVCT_SIM_NVML_ERROR=<code> makes initialization fail with <code>.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "nvml_abi.h"
#include "simtopo.h"
#include "simtopo_data.h"

#define EXPORT __attribute__((visibility("default")))

struct nvmlDevice_st { int gpu; int mig; };  /* mig < 0: the GPU itself */
struct nvmlGpuInstance_st { int mig; };      /* one GPU instance per MIG device */
struct nvmlComputeInstance_st { int mig; };

static struct nvmlDevice_st g_gpu_h[SIM_NGPUS + 1];
static struct nvmlDevice_st g_mig_h[SIM_NMIGS + 1];
static struct nvmlGpuInstance_st g_gi_h[SIM_NMIGS + 1];
static struct nvmlComputeInstance_st g_ci_h[SIM_NMIGS + 1];

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refs;
static int g_nvisible;
static int g_visible[SIM_NGPUS + 1];     /* visible index -> GPU */
static int g_gpu_vindex[SIM_NGPUS + 1];  /* GPU -> visible index, -1 if hidden */
static int g_mig_vindex[SIM_NMIGS + 1];  /* MIG -> index among its parent's visible MIGs, -1 if hidden */

/* Library directories stripped from our own path to find the root, longest first. */
static const char *const k_lib_dirs[] = {
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/usr/local/nvidia/lib64",
    "/usr/local/lib/x86_64-linux-gnu",
    "/usr/local/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/local/lib",
    "/usr/lib64",
    "/usr/lib",
    "/lib64",
    "/lib",
};

static void find_root(char *root, size_t size)
{
    Dl_info info;
    char dir[4096];
    char *slash;
    size_t i, n;

    root[0] = '\0';
    if (!dladdr((void *)&find_root, &info) || info.dli_fname == NULL)
        return;
    snprintf(dir, sizeof dir, "%s", info.dli_fname);
    slash = strrchr(dir, '/');
    if (slash == NULL)
        return;
    *slash = '\0';
    n = strlen(dir);
    for (i = 0; i < sizeof k_lib_dirs / sizeof k_lib_dirs[0]; i++) {
        size_t m = strlen(k_lib_dirs[i]);
        if (n >= m && strcmp(dir + n - m, k_lib_dirs[i]) == 0) {
            dir[n - m] = '\0';
            snprintf(root, size, "%s", dir);
            return;
        }
    }
}

static int exists(const char *root, const char *fmt, unsigned int arg)
{
    char rel[256], path[4400];
    struct stat st;

    snprintf(rel, sizeof rel, fmt, arg);
    snprintf(path, sizeof path, "%s%s", root, rel);
    return stat(path, &st) == 0;
}

static void compute_view(const char *root)
{
    int i, m;

    g_nvisible = 0;
    for (i = 0; i < SIM_NGPUS; i++) {
        g_gpu_h[i].gpu = i;
        g_gpu_h[i].mig = -1;
        g_gpu_vindex[i] = -1;
        if (exists(root, "/dev/nvidia%u", sim_gpus[i].minor)) {
            g_gpu_vindex[i] = g_nvisible;
            g_visible[g_nvisible++] = i;
        }
    }
    for (i = 0; i < SIM_NGPUS; i++) {
        int next = 0;
        for (m = sim_gpus[i].mig_first; m < sim_gpus[i].mig_first + sim_gpus[i].mig_count; m++) {
            g_mig_h[m].gpu = i;
            g_mig_h[m].mig = m;
            g_gi_h[m].mig = m;
            g_ci_h[m].mig = m;
            g_mig_vindex[m] = -1;
            if (g_gpu_vindex[i] >= 0 && sim_gpus[i].mig_enabled &&
                exists(root, "/dev/nvidia-caps/nvidia-cap%u", sim_migs[m].gi_cap_minor) &&
                exists(root, "/dev/nvidia-caps/nvidia-cap%u", sim_migs[m].ci_cap_minor))
                g_mig_vindex[m] = next++;
        }
    }
}

/* The index of h in a table, or -1 when h does not point exactly at an element. */
static int slot(const void *h, const void *base, size_t size, int count)
{
    uintptr_t p = (uintptr_t)h, b = (uintptr_t)base;

    if (h == NULL || p < b || p >= b + size * (size_t)count || (p - b) % size != 0)
        return -1;
    return (int)((p - b) / size);
}

/* Resolve a device handle to its GPU and MIG device (-1 for a GPU handle). */
static nvmlReturn_t resolve(nvmlDevice_t h, int *gpu, int *mig)
{
    int i;

    if (g_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    i = slot(h, g_gpu_h, sizeof g_gpu_h[0], SIM_NGPUS);
    if (i >= 0 && g_gpu_vindex[i] >= 0) {
        *gpu = i;
        *mig = -1;
        return NVML_SUCCESS;
    }
    i = slot(h, g_mig_h, sizeof g_mig_h[0], SIM_NMIGS);
    if (i >= 0 && g_mig_vindex[i] >= 0) {
        *gpu = sim_migs[i].gpu;
        *mig = i;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

#define RESOLVE(h, out)                                   \
    int gpu_, mig_;                                       \
    nvmlReturn_t r_ = resolve((h), &gpu_, &mig_);         \
    if (r_ != NVML_SUCCESS)                               \
        return r_;                                        \
    if ((void *)(out) == NULL)                            \
        return NVML_ERROR_INVALID_ARGUMENT;               \
    const struct sim_gpu *g = &sim_gpus[gpu_];            \
    const struct sim_mig *mg = mig_ >= 0 ? &sim_migs[mig_] : NULL; \
    (void)g; (void)mg

/* A status query real NVML answers for whole GPUs only. */
#define GPU_ONLY(h, out)                                  \
    RESOLVE(h, out);                                      \
    if (mg != NULL)                                       \
        return NVML_ERROR_NOT_SUPPORTED

static int gi_slot(nvmlGpuInstance_t h)
{
    int m = g_refs ? slot(h, g_gi_h, sizeof g_gi_h[0], SIM_NMIGS) : -1;
    return m >= 0 && g_mig_vindex[m] >= 0 ? m : -1;
}

static int ci_slot(nvmlComputeInstance_t h)
{
    int m = g_refs ? slot(h, g_ci_h, sizeof g_ci_h[0], SIM_NMIGS) : -1;
    return m >= 0 && g_mig_vindex[m] >= 0 ? m : -1;
}

static nvmlReturn_t copy_str(char *buf, unsigned int len, const char *s)
{
    size_t n = strlen(s) + 1;

    if (buf == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (n > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, n);
    return NVML_SUCCESS;
}

/* ---- initialization and system queries ---- */

static nvmlReturn_t init(void)
{
    const char *forced = getenv("NVCT_SIM_NVML_ERROR");
    char root[4096];

    if (forced != NULL && *forced != '\0' && atoi(forced) != 0)
        return (nvmlReturn_t)atoi(forced);
    pthread_mutex_lock(&g_lock);
    if (g_refs == 0) {
        find_root(root, sizeof root);
        if (!exists(root, "/dev/nvidiactl", 0)) {
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
        compute_view(root);
    }
    g_refs++;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(); }
EXPORT nvmlReturn_t nvmlInit(void) { return init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return init(); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t r = NVML_SUCCESS;

    pthread_mutex_lock(&g_lock);
    if (g_refs == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else
        g_refs--;
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupted request";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 23: return "Insufficient resources";
    case 25: return "Argument version mismatch";
    case 26: return "Deprecated";
    case 27: return "Not ready";
    case 28: return "GPU not found";
    case 29: return "Invalid state";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return copy_str(version, length, SIM_DRIVER_VERSION);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return copy_str(version, length, SIM_NVML_VERSION);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (cudaDriverVersion == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = SIM_CUDA_VERSION;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    char path[64], buf[4096];
    size_t n;
    FILE *f;

    if (g_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (name == NULL || length == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(path, sizeof path, "/proc/%u/cmdline", pid);
    f = fopen(path, "r");
    if (f == NULL)
        return NVML_ERROR_NOT_FOUND;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    snprintf(name, length, "%s", buf);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlUnitGetCount(unsigned int *unitCount)
{
    if (g_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (unitCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *unitCount = 0;
    return NVML_SUCCESS;
}

/* ---- enumeration ---- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (g_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (deviceCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = (unsigned int)g_nvisible;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (g_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= (unsigned int)g_nvisible)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_gpu_h[g_visible[index]];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    int i;

    if (g_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (uuid == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < SIM_NGPUS; i++) {
        if (g_gpu_vindex[i] >= 0 && strcmp(sim_gpus[i].uuid, uuid) == 0) {
            *device = &g_gpu_h[i];
            return NVML_SUCCESS;
        }
    }
    for (i = 0; i < SIM_NMIGS; i++) {
        if (g_mig_vindex[i] >= 0 && strcmp(sim_migs[i].uuid, uuid) == 0) {
            *device = &g_mig_h[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    unsigned int domain = 0, bus, dev, fn;
    char extra;
    int i;

    if (g_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (pciBusId == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (sscanf(pciBusId, "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &extra) != 4) {
        domain = 0;
        if (sscanf(pciBusId, "%x:%x.%x%c", &bus, &dev, &fn, &extra) != 3)
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (i = 0; i < SIM_NGPUS; i++) {
        const struct sim_gpu *g = &sim_gpus[i];
        if (g_gpu_vindex[i] >= 0 && g->domain == domain && g->bus == bus && g->device == dev &&
            g->function == fn) {
            *device = &g_gpu_h[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    RESOLVE(device, index);
    *index = (unsigned int)(mg ? g_mig_vindex[mig_] : g_gpu_vindex[gpu_]);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    GPU_ONLY(device, minorNumber);
    *minorNumber = g->minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    RESOLVE(device, uuid);
    return copy_str(uuid, length, mg ? mg->uuid : g->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    RESOLVE(device, name);
    return copy_str(name, length, mg ? mg->name : g->name);
}

static void fill_pci(const struct sim_gpu *g, char *legacy, char *busid, size_t busid_size,
                     unsigned int *fields)
{
    snprintf(legacy, NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE, "%04X:%02X:%02X.%X", g->domain & 0xffff, g->bus,
             g->device, g->function);
    if (busid != NULL)
        snprintf(busid, busid_size, "%08X:%02X:%02X.%X", g->domain, g->bus, g->device, g->function);
    fields[0] = g->domain;
    fields[1] = g->bus;
    fields[2] = g->device;
    fields[3] = g->pci_device_id;
    fields[4] = g->pci_subsystem_id;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    unsigned int f[5];

    RESOLVE(device, pci);
    memset(pci, 0, sizeof *pci);
    fill_pci(g, pci->busIdLegacy, pci->busId, sizeof pci->busId, f);
    pci->domain = f[0];
    pci->bus = f[1];
    pci->device = f[2];
    pci->pciDeviceId = f[3];
    pci->pciSubSystemId = f[4];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_v1_t *pci)
{
    unsigned int f[5];

    RESOLVE(device, pci);
    memset(pci, 0, sizeof *pci);
    fill_pci(g, pci->busId, NULL, 0, f);
    pci->domain = f[0];
    pci->bus = f[1];
    pci->device = f[2];
    pci->pciDeviceId = f[3];
    pci->pciSubSystemId = f[4];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *type)
{
    RESOLVE(device, type);
    *type = g->brand;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch)
{
    RESOLVE(device, arch);
    *arch = (unsigned int)g->architecture;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    RESOLVE(device, major);
    if (minor == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t device, unsigned int *numCores)
{
    RESOLVE(device, numCores);
    *numCores = mg ? g->cores / g->multiprocessors * mg->multiprocessors : g->cores;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    RESOLVE(device, serial);
    return copy_str(serial, length, g->serial);
}

EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version, unsigned int length)
{
    RESOLVE(device, version);
    return copy_str(version, length, g->vbios);
}

EXPORT nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char *partNumber, unsigned int length)
{
    RESOLVE(device, partNumber);
    return copy_str(partNumber, length, g->board_part_number);
}

/* ---- status (what nvidia-smi shows) ---- */

#define MIB 1048576ULL

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    RESOLVE(device, memory);
    memory->total = (mg ? mg->memory_mib : g->memory_mib) * MIB;
    memory->used = mg ? 11 * MIB : g->reserved_mib * MIB;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    RESOLVE(device, memory);
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = (mg ? mg->memory_mib : g->memory_mib) * MIB;
    memory->reserved = mg ? 0 : g->reserved_mib * MIB;
    memory->used = mg ? 11 * MIB : 1 * MIB;
    memory->free = memory->total - memory->reserved - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory)
{
    GPU_ONLY(device, bar1Memory);
    bar1Memory->bar1Total = 131072 * MIB;
    bar1Memory->bar1Used = 1 * MIB;
    bar1Memory->bar1Free = bar1Memory->bar1Total - bar1Memory->bar1Used;
    return NVML_SUCCESS;
}

static nvmlReturn_t gpu_uint(nvmlDevice_t device, unsigned int *out, unsigned int value)
{
    GPU_ONLY(device, out);
    *out = value;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode)
{
    GPU_ONLY(device, mode);
    *mode = g->persistence_mode;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, int *isActive)
{
    return gpu_uint(device, (unsigned int *)isActive, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, int *display)
{
    return gpu_uint(device, (unsigned int *)display, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending)
{
    GPU_ONLY(device, current);
    if (pending == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                                unsigned long long *eccCounts)
{
    GPU_ONLY(device, eccCounts);
    (void)errorType;
    (void)counterType;
    *eccCounts = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensorType, unsigned int *temp)
{
    GPU_ONLY(device, temp);
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = 30 + (g->minor * 7) % 10;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    GPU_ONLY(device, speed);
    return NVML_ERROR_NOT_SUPPORTED;  /* passively cooled */
}

EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, int *pState)
{
    return gpu_uint(device, (unsigned int *)pState, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, int *pState)
{
    return gpu_uint(device, (unsigned int *)pState, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    GPU_ONLY(device, power);
    *power = 68000 + 1000 * (g->minor % 8);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    GPU_ONLY(device, limit);
    *limit = g->power_limit_mw;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    return nvmlDeviceGetEnforcedPowerLimit(device, limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *defaultLimit)
{
    return nvmlDeviceGetEnforcedPowerLimit(device, defaultLimit);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    GPU_ONLY(device, utilization);
    if (g->mig_enabled)
        return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = 0;
    utilization->memory = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, int *mode)
{
    return gpu_uint(device, (unsigned int *)mode, 0);
}

static unsigned int clock_mhz(int type, int max)
{
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM: return max ? 1980 : 345;
    case NVML_CLOCK_MEM: return 2619;
    case NVML_CLOCK_VIDEO: return max ? 1545 : 765;
    default: return 0;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock)
{
    GPU_ONLY(device, clock);
    if (clock_mhz(type, 0) == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *clock = clock_mhz(type, 0);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock)
{
    GPU_ONLY(device, clock);
    if (clock_mhz(type, 1) == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *clock = clock_mhz(type, 1);
    return NVML_SUCCESS;
}

/* Nothing ever runs on a simulated GPU. */
static nvmlReturn_t no_processes(nvmlDevice_t device, unsigned int *infoCount)
{
    RESOLVE(device, infoCount);
    *infoCount = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, void *i)
{ (void)i; return no_processes(d, c); }
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *i)
{ (void)i; return no_processes(d, c); }
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i)
{ (void)i; return no_processes(d, c); }
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, void *i)
{ (void)i; return no_processes(d, c); }
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *i)
{ (void)i; return no_processes(d, c); }
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i)
{ (void)i; return no_processes(d, c); }
EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i)
{ (void)i; return no_processes(d, c); }

/* ---- MIG ---- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    GPU_ONLY(device, currentMode);
    if (pendingMode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = *pendingMode = g->mig_enabled ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    RESOLVE(device, isMigDevice);
    *isMigDevice = mg != NULL;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    GPU_ONLY(device, count);
    *count = g->mig_capable ? g->max_mig_devices : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                       nvmlDevice_t *migDevice)
{
    int m;

    GPU_ONLY(device, migDevice);
    if (!g->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    if (index >= g->max_mig_devices)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (m = g->mig_first; m < g->mig_first + g->mig_count; m++) {
        if (g_mig_vindex[m] == (int)index) {
            *migDevice = &g_mig_h[m];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    RESOLVE(migDevice, device);
    if (mg == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_gpu_h[gpu_];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    RESOLVE(device, id);
    if (mg == NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = mg->gi;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    RESOLVE(device, id);
    if (mg == NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = mg->ci;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    RESOLVE(device, attributes);
    if (mg == NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(attributes, 0, sizeof *attributes);
    attributes->multiprocessorCount = mg->multiprocessors;
    attributes->sharedCopyEngineCount = mg->slices;
    attributes->sharedDecoderCount = mg->slices == 1 ? 1 : mg->slices;
    attributes->sharedJpegCount = mg->slices == 7 ? 7 : 1;
    attributes->sharedOfaCount = mg->slices == 7 ? 1 : 0;
    attributes->gpuInstanceSliceCount = mg->slices;
    attributes->computeInstanceSliceCount = mg->slices;
    attributes->memorySizeMB = mg->memory_mib;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

static const struct sim_profile *find_profile(const struct sim_gpu *g, unsigned int profile)
{
    int p;

    for (p = g->profile_first; p < g->profile_first + g->profile_count; p++)
        if (sim_profiles[p].profile == profile)
            return &sim_profiles[p];
    return NULL;
}

static void fill_gi_profile(const struct sim_profile *p, nvmlGpuInstanceProfileInfo_t *info)
{
    memset(info, 0, sizeof *info);
    info->id = p->id;
    info->isP2pSupported = 0;
    info->sliceCount = p->slices;
    info->instanceCount = p->instance_count;
    info->multiprocessorCount = p->multiprocessors;
    info->copyEngineCount = p->slices;
    info->decoderCount = p->slices;
    info->jpegCount = p->slices == 7 ? 7 : 1;
    info->ofaCount = p->slices == 7 ? 1 : 0;
    info->memorySizeMB = p->memory_mib;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                       nvmlGpuInstanceProfileInfo_t *info)
{
    const struct sim_profile *p;

    GPU_ONLY(device, info);
    if (!g->mig_capable || (p = find_profile(g, profile)) == NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    fill_gi_profile(p, info);
    return NVML_SUCCESS;
}

/* v2 or v3 (by the version the caller set): v3 carries the profile's capabilities (+gfx). */
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_v2_t *info)
{
    nvmlGpuInstanceProfileInfo_t v1;
    const struct sim_profile *p;

    GPU_ONLY(device, info);
    if (info->version != nvmlGpuInstanceProfileInfo_v2 && info->version != nvmlGpuInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!g->mig_capable || (p = find_profile(g, profile)) == NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    fill_gi_profile(p, &v1);
/* v2 and v3 share these fields from v1, at other offsets (v3 has no isP2pSupported). */
#define COPY_GI_PROFILE(dst) do { \
        (dst)->id = v1.id; (dst)->sliceCount = v1.sliceCount; (dst)->instanceCount = v1.instanceCount; \
        (dst)->multiprocessorCount = v1.multiprocessorCount; (dst)->copyEngineCount = v1.copyEngineCount; \
        (dst)->decoderCount = v1.decoderCount; (dst)->encoderCount = v1.encoderCount; \
        (dst)->jpegCount = v1.jpegCount; (dst)->ofaCount = v1.ofaCount; (dst)->memorySizeMB = v1.memorySizeMB; \
        snprintf((dst)->name, sizeof (dst)->name, "MIG %s", p->name); \
    } while (0)
    if (info->version == nvmlGpuInstanceProfileInfo_v3) {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;

        memset(v3, 0, sizeof *v3);
        v3->version = nvmlGpuInstanceProfileInfo_v3;
        COPY_GI_PROFILE(v3);
        v3->capabilities = p->capabilities;
        return NVML_SUCCESS;
    }
    memset(info, 0, sizeof *info);
    info->version = nvmlGpuInstanceProfileInfo_v2;
    COPY_GI_PROFILE(info);
    info->isP2pSupported = v1.isP2pSupported;
    return NVML_SUCCESS;
#undef COPY_GI_PROFILE
}

/* The visible MIG devices of GPU g that pass keep(), written to out (may be NULL). */
static unsigned int gpu_instances(const struct sim_gpu *g, unsigned int profile_id, int by_profile,
                                  unsigned int gi, int *out)
{
    unsigned int n = 0;
    int m;

    for (m = g->mig_first; m < g->mig_first + g->mig_count; m++) {
        if (g_mig_vindex[m] < 0 || (by_profile && sim_migs[m].gi_profile_id != profile_id) ||
            (!by_profile && sim_migs[m].gi != gi))
            continue;
        if (out != NULL)
            out[n] = m;
        n++;
    }
    return n;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                             nvmlGpuInstance_t *gpuInstances, unsigned int *count)
{
    int found[SIM_NMIGS + 1];
    unsigned int i, n;

    GPU_ONLY(device, count);
    if (gpuInstances == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    n = gpu_instances(g, profileId, 1, 0, found);
    for (i = 0; i < n; i++)
        gpuInstances[i] = &g_gi_h[found[i]];
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                nvmlGpuInstance_t *gpuInstance)
{
    int found[SIM_NMIGS + 1];

    GPU_ONLY(device, gpuInstance);
    if (!g->mig_capable || !g->mig_enabled)
        return NVML_ERROR_NOT_SUPPORTED;
    if (gpu_instances(g, 0, 0, id, found) == 0)
        return NVML_ERROR_NOT_FOUND;
    *gpuInstance = &g_gi_h[found[0]];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    int m = gi_slot(gpuInstance);

    if (g_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (m < 0 || info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &g_gpu_h[sim_migs[m].gpu];
    info->id = sim_migs[m].gi;
    info->profileId = sim_migs[m].gi_profile_id;
    info->placement.start = sim_migs[m].placement_start;
    info->placement.size = sim_migs[m].placement_size;
    return NVML_SUCCESS;
}

static nvmlReturn_t ci_profile(nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
                               nvmlComputeInstanceProfileInfo_t *info, int *mig)
{
    int m = gi_slot(gpuInstance);
    const struct sim_mig *mg;

    if (g_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (m < 0 || info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    mg = &sim_migs[m];
    if (profile != mg->ci_profile || engProfile != 0)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->id = mg->ci_profile;
    info->sliceCount = mg->slices;
    info->instanceCount = 1;
    info->multiprocessorCount = mg->multiprocessors;
    info->sharedCopyEngineCount = mg->slices;
    info->sharedDecoderCount = mg->slices;
    info->sharedJpegCount = mg->slices == 7 ? 7 : 1;
    info->sharedOfaCount = mg->slices == 7 ? 1 : 0;
    *mig = m;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance,
        unsigned int profile, unsigned int engProfile, nvmlComputeInstanceProfileInfo_t *info)
{
    int m;
    return ci_profile(gpuInstance, profile, engProfile, info, &m);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance,
        unsigned int profile, unsigned int engProfile, nvmlComputeInstanceProfileInfo_v2_t *info)
{
    nvmlComputeInstanceProfileInfo_t v1;
    nvmlReturn_t r;
    int m;

    if (info != NULL && info->version != nvmlComputeInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    r = ci_profile(gpuInstance, profile, engProfile, info ? &v1 : NULL, &m);
    if (r != NVML_SUCCESS)
        return r;
    memset(info, 0, sizeof *info);
    info->version = nvmlComputeInstanceProfileInfo_v2;
    info->id = v1.id;
    info->sliceCount = v1.sliceCount;
    info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->sharedCopyEngineCount = v1.sharedCopyEngineCount;
    info->sharedDecoderCount = v1.sharedDecoderCount;
    info->sharedEncoderCount = v1.sharedEncoderCount;
    info->sharedJpegCount = v1.sharedJpegCount;
    info->sharedOfaCount = v1.sharedOfaCount;
    snprintf(info->name, sizeof info->name, "MIG %s", sim_migs[m].profile_name);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
        nvmlComputeInstance_t *computeInstances, unsigned int *count)
{
    int m = gi_slot(gpuInstance);

    if (g_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (m < 0 || computeInstances == NULL || count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    if (profileId == sim_migs[m].ci_profile) {
        computeInstances[0] = &g_ci_h[m];
        *count = 1;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
        nvmlComputeInstance_t *computeInstance)
{
    int m = gi_slot(gpuInstance);

    if (g_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (m < 0 || computeInstance == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (id != sim_migs[m].ci)
        return NVML_ERROR_NOT_FOUND;
    *computeInstance = &g_ci_h[m];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                 nvmlComputeInstanceInfo_t *info)
{
    int m = ci_slot(computeInstance);

    if (g_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (m < 0 || info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &g_gpu_h[sim_migs[m].gpu];
    info->gpuInstance = &g_gi_h[m];
    info->id = sim_migs[m].ci;
    info->profileId = sim_migs[m].ci_profile;
    info->placement.start = 0;
    info->placement.size = sim_migs[m].slices;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                              nvmlComputeInstanceInfo_t *info)
{
    return nvmlComputeInstanceGetInfo_v2(computeInstance, info);
}

/* ---- GPU memory limits of a cgroup ----
 * Real NVML applies them through the driver; the mock checks what real NVML
 * would refuse (a MIG handle, a namespace that is no directory, soft above
 * hard) and appends "<uuid> <namespace> <soft> <hard>" to
 * <root>/var/nvml-memory-limits.log, so tests see the call. */
#define MEMORY_LIMITS_LOG "/var/nvml-memory-limits.log"

EXPORT nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t device, nvmlDeviceSetMemoryLimits_v1_t *limits)
{
    char root[4096], path[4200];
    struct stat st;
    FILE *log;

    GPU_ONLY(device, limits);
    if (limits->nameSpace == NULL || limits->nameSpace[0] != '/' || limits->softLimit > limits->hardLimit)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (stat(limits->nameSpace, &st) != 0 || !S_ISDIR(st.st_mode))
        return NVML_ERROR_NOT_FOUND;
    find_root(root, sizeof root);
    snprintf(path, sizeof path, "%s%s", root, MEMORY_LIMITS_LOG);
    log = fopen(path, "ae");
    if (log == NULL)
        return NVML_ERROR_UNKNOWN;
    fprintf(log, "%s %s %llu %llu\n", g->uuid, limits->nameSpace, limits->softLimit, limits->hardLimit);
    fclose(log);
    return NVML_SUCCESS;
}
