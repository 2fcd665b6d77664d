/*
 * Simulated nvidia-smi: reports what libnvidia-ml.so.1 (a DT_NEEDED found
 * through the loader, like any tool's) shows. Supports the invocations
 * scripts use: no arguments (the status table), -L, --version and
 * --query-gpu=... --format=csv[,noheader][,nounits].
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nvml_abi.h"

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
const char *nvmlErrorString(nvmlReturn_t);
nvmlReturn_t nvmlSystemGetDriverVersion(char *, unsigned int);
nvmlReturn_t nvmlSystemGetNVMLVersion(char *, unsigned int);
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t, char *, unsigned int);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t, char *, unsigned int);
nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t, char *, unsigned int);
nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t, char *, unsigned int);
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t, nvmlPciInfo_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t, unsigned int *, unsigned int *);
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t, unsigned int *);
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t, unsigned int, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t, unsigned int *);
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t, unsigned int *);
nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t, nvmlDeviceAttributes_t *);
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t, int *, int *);
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t, int, unsigned int *);
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t, unsigned int *);
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t, unsigned int *);
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t, int *);

#define MIB 1048576ULL
#define RULE "+-----------------------------------------------------------------------------------------+\n"
#define RULE3 "+-----------------------------------------+------------------------+----------------------+\n"

static const char *k_no_driver =
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n";

static int exit_code(nvmlReturn_t r)
{
    switch (r) {
    case 2: case 3: case 4: case 6: case 8: case 9: case 10: case 12: case 14: case 15:
        return r;
    default:
        return 255;
    }
}

static void cuda_version(char *buf, size_t size)
{
    int v = 0;

    nvmlSystemGetCudaDriverVersion(&v);
    snprintf(buf, size, "%d.%d", v / 1000, v % 1000 / 10);
}

/* The profile part of a MIG device name: "NVIDIA H100 80GB HBM3 MIG 3g.40gb" -> "3g.40gb". */
static const char *profile_of(const char *name)
{
    const char *p = strstr(name, " MIG ");
    return p ? p + 5 : name;
}

static int mig_enabled(nvmlDevice_t d)
{
    unsigned int cur = 0, pend = 0;
    return nvmlDeviceGetMigMode(d, &cur, &pend) == NVML_SUCCESS && cur == NVML_DEVICE_MIG_ENABLE;
}

static void list_gpus(unsigned int count)
{
    char name[96], uuid[96];
    unsigned int i, j, max;
    nvmlDevice_t d, m;

    for (i = 0; i < count; i++) {
        if (nvmlDeviceGetHandleByIndex_v2(i, &d) != NVML_SUCCESS)
            continue;
        nvmlDeviceGetName(d, name, sizeof name);
        nvmlDeviceGetUUID(d, uuid, sizeof uuid);
        printf("GPU %u: %s (UUID: %s)\n", i, name, uuid);
        if (!mig_enabled(d) || nvmlDeviceGetMaxMigDeviceCount(d, &max) != NVML_SUCCESS)
            continue;
        for (j = 0; j < max; j++) {
            if (nvmlDeviceGetMigDeviceHandleByIndex(d, j, &m) != NVML_SUCCESS)
                continue;
            nvmlDeviceGetName(m, name, sizeof name);
            nvmlDeviceGetUUID(m, uuid, sizeof uuid);
            printf("  MIG %-11s Device %2u: (UUID: %s)\n", profile_of(name), j, uuid);
        }
    }
}

static void row3(const char *a, const char *b, const char *c)
{
    printf("|%-41s|%-24s|%-22s|\n", a, b, c);
}

static void table(unsigned int count)
{
    char driver[80], cuda[16], name[96], a[256], b[256], c[256], now[64];
    unsigned int i, j, max, temp = 0, power = 0, limit = 0, gi, ci;
    nvmlPciInfo_t pci;
    nvmlMemory_t mem;
    nvmlDevice_t d, m;
    time_t t = time(NULL);
    int any_mig = 0, persistence;

    strftime(now, sizeof now, "%a %b %e %H:%M:%S %Y", localtime(&t));
    nvmlSystemGetDriverVersion(driver, sizeof driver);
    cuda_version(cuda, sizeof cuda);
    printf("%s       \n", now);
    printf(RULE);
    printf("| NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %-9s|\n", driver, driver, cuda);
    printf("|-----------------------------------------+------------------------+----------------------+\n");
    row3(" GPU  Name                 Persistence-M ", " Bus-Id          Disp.A ", " Volatile Uncorr. ECC ");
    row3(" Fan  Temp   Perf          Pwr:Usage/Cap ", "           Memory-Usage ", " GPU-Util  Compute M. ");
    row3("", "", "               MIG M. ");
    printf("|=========================================+========================+======================|\n");
    for (i = 0; i < count; i++) {
        if (nvmlDeviceGetHandleByIndex_v2(i, &d) != NVML_SUCCESS)
            continue;
        nvmlDeviceGetName(d, name, sizeof name);
        nvmlDeviceGetPciInfo_v3(d, &pci);
        nvmlDeviceGetMemoryInfo(d, &mem);
        nvmlDeviceGetTemperature(d, NVML_TEMPERATURE_GPU, &temp);
        nvmlDeviceGetPowerUsage(d, &power);
        nvmlDeviceGetEnforcedPowerLimit(d, &limit);
        any_mig |= mig_enabled(d);
        persistence = 0;
        nvmlDeviceGetPersistenceMode(d, &persistence);
        snprintf(a, sizeof a, "%4u  %-28.28s%5s  ", i, name, persistence ? "On" : "Off");
        snprintf(b, sizeof b, "%19s Off ", pci.busId);
        snprintf(c, sizeof c, "%21s ", mig_enabled(d) ? "On" : "0");
        row3(a, b, c);
        snprintf(a, sizeof a, "%4s %4uC %5s %14uW / %4uW ", "N/A", temp, "P0", power / 1000, limit / 1000);
        snprintf(b, sizeof b, "%8lluMiB / %6lluMiB ", mem.used / MIB, mem.total / MIB);
        snprintf(c, sizeof c, "%8s %12s ", mig_enabled(d) ? "N/A" : "0%", "Default");
        row3(a, b, c);
        snprintf(c, sizeof c, "%21s ", mig_enabled(d) ? "Enabled" : "Disabled");
        row3("", "", c);
        printf(RULE3);
    }
    if (any_mig) {
        printf("\n" RULE);
        printf("| %-87s |\n", "MIG devices:");
        printf(RULE);
        printf("| %-87s |\n", "GPU  GI  CI  MIG  Profile                           Memory-Usage        SM");
        printf("|=========================================================================================|\n");
        for (i = 0; i < count; i++) {
            if (nvmlDeviceGetHandleByIndex_v2(i, &d) != NVML_SUCCESS || !mig_enabled(d) ||
                nvmlDeviceGetMaxMigDeviceCount(d, &max) != NVML_SUCCESS)
                continue;
            for (j = 0; j < max; j++) {
                nvmlDeviceAttributes_t attr;
                if (nvmlDeviceGetMigDeviceHandleByIndex(d, j, &m) != NVML_SUCCESS)
                    continue;
                nvmlDeviceGetName(m, name, sizeof name);
                nvmlDeviceGetMemoryInfo(m, &mem);
                nvmlDeviceGetGpuInstanceId(m, &gi);
                nvmlDeviceGetComputeInstanceId(m, &ci);
                nvmlDeviceGetAttributes_v2(m, &attr);
                snprintf(a, sizeof a, "%3u %3u %3u %4u  %-20s %14lluMiB / %6lluMiB %5u", i, gi, ci, j,
                         profile_of(name), mem.used / MIB, mem.total / MIB, attr.multiprocessorCount);
                printf("| %-87s |\n", a);
            }
        }
        printf(RULE);
    }
    printf("\n" RULE);
    printf("| %-87s |\n", "Processes:");
    printf("| %-87s |\n", " GPU   GI   CI        PID   Type   Process name                              GPU Memory");
    printf("| %-87s |\n", "       ID   ID                                                               Usage");
    printf("|=========================================================================================|\n");
    printf("| %-87s |\n", " No running processes found");
    printf(RULE);
}

struct field { const char *name, *header; };
static const struct field k_fields[] = {
    {"index", "index"}, {"count", "count"}, {"name", "name"}, {"gpu_name", "name"}, {"uuid", "uuid"},
    {"gpu_uuid", "uuid"}, {"serial", "serial"}, {"pci.bus_id", "pci.bus_id"},
    {"gpu_bus_id", "pci.bus_id"}, {"pci.device_id", "pci.device_id"}, {"driver_version", "driver_version"},
    {"vbios_version", "vbios_version"}, {"memory.total", "memory.total [MiB]"},
    {"memory.used", "memory.used [MiB]"}, {"memory.free", "memory.free [MiB]"},
    {"mig.mode.current", "mig.mode.current"}, {"mig.mode.pending", "mig.mode.pending"},
    {"compute_cap", "compute_cap"}, {"temperature.gpu", "temperature.gpu"},
    {"power.limit", "power.limit [W]"},
};

static const struct field *lookup(const char *name)
{
    size_t i;
    for (i = 0; i < sizeof k_fields / sizeof k_fields[0]; i++)
        if (strcmp(k_fields[i].name, name) == 0)
            return &k_fields[i];
    return NULL;
}

static void value(const char *field, unsigned int i, unsigned int count, nvmlDevice_t d, int units,
                  char *out, size_t size)
{
    nvmlPciInfo_t pci;
    nvmlMemory_t mem;
    unsigned int cur = 0, pend = 0, u = 0;
    int major = 0, minor = 0;

    if (strcmp(field, "index") == 0)
        snprintf(out, size, "%u", i);
    else if (strcmp(field, "count") == 0)
        snprintf(out, size, "%u", count);
    else if (strcmp(field, "name") == 0 || strcmp(field, "gpu_name") == 0)
        nvmlDeviceGetName(d, out, (unsigned int)size);
    else if (strcmp(field, "uuid") == 0 || strcmp(field, "gpu_uuid") == 0)
        nvmlDeviceGetUUID(d, out, (unsigned int)size);
    else if (strcmp(field, "serial") == 0)
        nvmlDeviceGetSerial(d, out, (unsigned int)size);
    else if (strcmp(field, "vbios_version") == 0)
        nvmlDeviceGetVbiosVersion(d, out, (unsigned int)size);
    else if (strcmp(field, "driver_version") == 0)
        nvmlSystemGetDriverVersion(out, (unsigned int)size);
    else if (strcmp(field, "pci.bus_id") == 0 || strcmp(field, "gpu_bus_id") == 0) {
        nvmlDeviceGetPciInfo_v3(d, &pci);
        snprintf(out, size, "%s", pci.busId);
    } else if (strcmp(field, "pci.device_id") == 0) {
        nvmlDeviceGetPciInfo_v3(d, &pci);
        snprintf(out, size, "0x%08X", pci.pciDeviceId);
    } else if (strncmp(field, "memory.", 7) == 0) {
        nvmlDeviceGetMemoryInfo(d, &mem);
        unsigned long long v = field[7] == 't' ? mem.total : field[7] == 'u' ? mem.used : mem.free;
        snprintf(out, size, units ? "%llu MiB" : "%llu", v / MIB);
    } else if (strncmp(field, "mig.mode.", 9) == 0) {
        if (nvmlDeviceGetMigMode(d, &cur, &pend) != NVML_SUCCESS)
            snprintf(out, size, "[N/A]");
        else
            snprintf(out, size, "%s", (field[9] == 'c' ? cur : pend) ? "Enabled" : "Disabled");
    } else if (strcmp(field, "compute_cap") == 0) {
        nvmlDeviceGetCudaComputeCapability(d, &major, &minor);
        snprintf(out, size, "%d.%d", major, minor);
    } else if (strcmp(field, "temperature.gpu") == 0) {
        nvmlDeviceGetTemperature(d, NVML_TEMPERATURE_GPU, &u);
        snprintf(out, size, "%u", u);
    } else if (strcmp(field, "power.limit") == 0) {
        nvmlDeviceGetEnforcedPowerLimit(d, &u);
        snprintf(out, size, units ? "%.2f W" : "%.2f", u / 1000.0);
    } else {
        snprintf(out, size, "[N/A]");
    }
}

static int query(const char *fields, const char *format, unsigned int count)
{
    char list[1024], *save = NULL, *f, out[128];
    const char *names[32];
    int n = 0, header = 1, units = 1, k;
    unsigned int i;
    nvmlDevice_t d;

    if (format == NULL || strncmp(format, "csv", 3) != 0) {
        fprintf(stderr, "Format must be specified when using --query-gpu: use --format=csv\n");
        return 2;
    }
    header = strstr(format, "noheader") == NULL;
    units = strstr(format, "nounits") == NULL;
    snprintf(list, sizeof list, "%s", fields);
    for (f = strtok_r(list, ",", &save); f != NULL && n < 32; f = strtok_r(NULL, ",", &save)) {
        while (*f == ' ')
            f++;
        if (lookup(f) == NULL) {
            printf("Field \"%s\" is not a valid field to query.\n\n", f);
            return 2;
        }
        names[n++] = f;
    }
    if (header)
        for (k = 0; k < n; k++)
            printf("%s%s", units ? lookup(names[k])->header : names[k], k + 1 < n ? ", " : "\n");
    for (i = 0; i < count; i++) {
        if (nvmlDeviceGetHandleByIndex_v2(i, &d) != NVML_SUCCESS)
            continue;
        for (k = 0; k < n; k++) {
            value(names[k], i, count, d, units, out, sizeof out);
            printf("%s%s", out, k + 1 < n ? ", " : "\n");
        }
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "NVIDIA System Management Interface -- v%s\n\n"
               "Usage: nvidia-smi [-L | --query-gpu=FIELDS --format=csv[,noheader][,nounits] | --version]\n",
            SIM_DRIVER_VERSION);
}

int main(int argc, char **argv)
{
    const char *fields = NULL, *format = NULL;
    int list = 0, version = 0, i, rc = 0;
    unsigned int count = 0;
    nvmlReturn_t r;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-L") == 0 || strcmp(argv[i], "--list-gpus") == 0)
            list = 1;
        else if (strcmp(argv[i], "--version") == 0)
            version = 1;
        else if (strncmp(argv[i], "--query-gpu=", 12) == 0)
            fields = argv[i] + 12;
        else if (strncmp(argv[i], "--format=", 9) == 0)
            format = argv[i] + 9;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n");
            return 2;
        }
    }
    r = nvmlInit_v2();
    if (r == NVML_ERROR_DRIVER_NOT_LOADED) {
        printf("%s", k_no_driver);
        return 9;
    }
    if (r != NVML_SUCCESS) {
        printf("Failed to initialize NVML: %s\n", nvmlErrorString(r));
        return exit_code(r);
    }
    if (version) {
        char driver[80], nvml[80], cuda[16];
        nvmlSystemGetDriverVersion(driver, sizeof driver);
        nvmlSystemGetNVMLVersion(nvml, sizeof nvml);
        cuda_version(cuda, sizeof cuda);
        printf("NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\n"
               "CUDA Version        : %s\n", driver, strchr(nvml, '.') ? strchr(nvml, '.') + 1 : nvml,
               driver, cuda);
        nvmlShutdown();
        return 0;
    }
    nvmlDeviceGetCount_v2(&count);
    if (count == 0) {
        printf("No devices were found\n");
        nvmlShutdown();
        return 6;
    }
    if (fields != NULL)
        rc = query(fields, format, count);
    else if (list)
        list_gpus(count);
    else
        table(count);
    nvmlShutdown();
    return rc;
}
