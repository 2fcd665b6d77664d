/*
 * Simulated libcuda: enough of the CUDA driver API for a "does CUDA see my
 * GPUs" check. Devices come from the simulated NVML next to this library
 * (else from libnvidia-ml.so.1 as the loader finds it): whole GPUs without
 * MIG, plus each visible MIG device of GPUs in MIG mode.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 512

typedef int CUresult;
typedef int CUdevice;
typedef struct { char bytes[16]; } CUuuid;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_UNKNOWN = 999,
};

typedef void *nvmlDevice_t;
typedef int (*init_fn)(void);
typedef int (*count_fn)(unsigned int *);
typedef int (*by_index_fn)(unsigned int, nvmlDevice_t *);
typedef int (*str_fn)(nvmlDevice_t, char *, unsigned int);
typedef int (*mode_fn)(nvmlDevice_t, unsigned int *, unsigned int *);
typedef int (*mig_fn)(nvmlDevice_t, unsigned int, nvmlDevice_t *);
typedef struct { unsigned long long total, free, used; } mem_t;
typedef int (*mem_fn)(nvmlDevice_t, mem_t *);
typedef int (*cc_fn)(nvmlDevice_t, int *, int *);

struct device {
    char name[96];
    char uuid[96];
    unsigned long long memory;
    int cc_major, cc_minor;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_initialized;
static int g_count;
static struct device g_devices[MAX_DEVICES];

static void *open_nvml(void)
{
    Dl_info info;
    char path[4096];
    char *slash;
    void *h;

    if (dladdr((void *)&open_nvml, &info) && info.dli_fname != NULL) {
        snprintf(path, sizeof path, "%s", info.dli_fname);
        slash = strrchr(path, '/');
        if (slash != NULL) {
            snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "libnvidia-ml.so.1");
            h = dlopen(path, RTLD_NOW);
            if (h != NULL)
                return h;
        }
    }
    return dlopen("libnvidia-ml.so.1", RTLD_NOW);
}

static void add_device(nvmlDevice_t d, str_fn name, str_fn uuid, mem_fn mem, cc_fn cc, nvmlDevice_t parent)
{
    struct device *out;
    mem_t m = {0, 0, 0};

    if (g_count >= MAX_DEVICES)
        return;
    out = &g_devices[g_count++];
    name(d, out->name, sizeof out->name);
    uuid(d, out->uuid, sizeof out->uuid);
    mem(d, &m);
    out->memory = m.total;
    cc(parent, &out->cc_major, &out->cc_minor);
}

static CUresult enumerate(void)
{
    void *h = open_nvml();
    init_fn init;
    count_fn count;
    by_index_fn by_index;
    str_fn name, uuid;
    mode_fn mig_mode;
    mig_fn mig_by_index;
    mem_fn mem;
    cc_fn cc;
    unsigned int n, i, j, cur, pend;
    int r;

    if (h == NULL)
        return CUDA_ERROR_NO_DEVICE;
    init = (init_fn)dlsym(h, "nvmlInit_v2");
    count = (count_fn)dlsym(h, "nvmlDeviceGetCount_v2");
    by_index = (by_index_fn)dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    name = (str_fn)dlsym(h, "nvmlDeviceGetName");
    uuid = (str_fn)dlsym(h, "nvmlDeviceGetUUID");
    mig_mode = (mode_fn)dlsym(h, "nvmlDeviceGetMigMode");
    mig_by_index = (mig_fn)dlsym(h, "nvmlDeviceGetMigDeviceHandleByIndex");
    mem = (mem_fn)dlsym(h, "nvmlDeviceGetMemoryInfo");
    cc = (cc_fn)dlsym(h, "nvmlDeviceGetCudaComputeCapability");
    if (!init || !count || !by_index || !name || !uuid || !mig_mode || !mig_by_index || !mem || !cc)
        return CUDA_ERROR_UNKNOWN;
    r = init();
    if (r == 9)
        return CUDA_ERROR_NO_DEVICE;
    if (r != 0 || count(&n) != 0)
        return CUDA_ERROR_UNKNOWN;
    g_count = 0;
    for (i = 0; i < n; i++) {
        nvmlDevice_t d, m;
        if (by_index(i, &d) != 0)
            continue;
        if (mig_mode(d, &cur, &pend) == 0 && cur == 1) {
            for (j = 0; j < 8; j++)
                if (mig_by_index(d, j, &m) == 0)
                    add_device(m, name, uuid, mem, cc, d);
        } else {
            add_device(d, name, uuid, mem, cc, d);
        }
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuInit(unsigned int flags)
{
    CUresult r = CUDA_SUCCESS;

    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (!g_initialized) {
        r = enumerate();
        g_initialized = r == CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuDriverGetVersion(int *driverVersion)
{
    if (driverVersion == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = SIM_CUDA_VERSION;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    if (!g_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_count;
    return CUDA_SUCCESS;
}

static const struct device *get(CUdevice dev)
{
    return dev >= 0 && dev < g_count ? &g_devices[dev] : NULL;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (!g_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (get(ordinal) == NULL)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    const struct device *d;

    if (!g_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if ((d = get(dev)) == NULL)
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", d->name);
    return CUDA_SUCCESS;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    const struct device *d;
    const char *p;
    int n = 0;

    if (!g_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (uuid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if ((d = get(dev)) == NULL)
        return CUDA_ERROR_INVALID_DEVICE;
    memset(uuid, 0, sizeof *uuid);
    p = strchr(d->uuid, '-');  /* skip "GPU" / "MIG" */
    for (p = p ? p + 1 : d->uuid; *p != '\0' && n < 32; p++) {
        int v = hexval(*p);
        if (v < 0)
            continue;
        uuid->bytes[n / 2] = (char)(uuid->bytes[n / 2] | (n % 2 ? v : v << 4));
        n++;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid(uuid, dev);
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    const struct device *d;

    if (!g_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if ((d = get(dev)) == NULL)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)d->memory;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    const struct device *d;

    if (!g_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (major == NULL || minor == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if ((d = get(dev)) == NULL)
        return CUDA_ERROR_INVALID_DEVICE;
    *major = d->cc_major;
    *minor = d->cc_minor;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **str)
{
    if (str == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case CUDA_SUCCESS: *str = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *str = "invalid argument"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *str = "initialization error"; break;
    case CUDA_ERROR_NO_DEVICE: *str = "no CUDA-capable device is detected"; break;
    case CUDA_ERROR_INVALID_DEVICE: *str = "invalid device ordinal"; break;
    case CUDA_ERROR_UNKNOWN: *str = "unknown error"; break;
    default: *str = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
