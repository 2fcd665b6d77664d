/* Loads libcuda.so.1 by SONAME, as CUDA programs do, and uses it: the driver version, each
 * device's name and memory, and where the driver allows it a context and an allocation.
 * Prints one line per fact; exits non-zero on the first CUDA error. Files named as arguments are
 * printed first (the image has no shell to cat them). */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*fn_int)(unsigned int);
typedef int (*fn_pint)(int *);
typedef int (*fn_dev)(int *, int);
typedef int (*fn_name)(char *, int, int);
typedef int (*fn_mem)(size_t *, int);
typedef int (*fn_ctx)(void **, unsigned int, int);
typedef int (*fn_alloc)(unsigned long long *, size_t);
typedef int (*fn_free)(unsigned long long);

#define NEED(type, name) type name = (type)dlsym(lib, #name); if (!name) { printf("missing %s\n", #name); return 3; }
#define CHECK(call) do { int rc_ = (call); if (rc_) { printf("error %d in %s\n", rc_, #call); return 4; } } while (0)

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        char buf[4096];
        size_t n;
        FILE *f = fopen(argv[i], "r");
        if (!f) { printf("open %s failed\n", argv[i]); return 5; }
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
        fclose(f);
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { printf("dlopen: %s\n", dlerror()); return 2; }
    NEED(fn_int, cuInit) NEED(fn_pint, cuDriverGetVersion) NEED(fn_pint, cuDeviceGetCount)
    NEED(fn_dev, cuDeviceGet) NEED(fn_name, cuDeviceGetName) NEED(fn_mem, cuDeviceTotalMem_v2)
    int version = 0, count = 0;
    CHECK(cuInit(0));
    CHECK(cuDriverGetVersion(&version));
    CHECK(cuDeviceGetCount(&count));
    printf("cuda %d devices %d\n", version, count);
    for (int i = 0; i < count; i++) {
        int dev; char name[256] = {0}; size_t mem = 0;
        CHECK(cuDeviceGet(&dev, i));
        CHECK(cuDeviceGetName(name, sizeof name, dev));
        CHECK(cuDeviceTotalMem_v2(&mem, dev));
        printf("device %d %s\n", i, name);
        fn_ctx cuCtxCreate_v2 = (fn_ctx)dlsym(lib, "cuCtxCreate_v2");
        fn_alloc cuMemAlloc_v2 = (fn_alloc)dlsym(lib, "cuMemAlloc_v2");
        fn_free cuMemFree_v2 = (fn_free)dlsym(lib, "cuMemFree_v2");
        if (cuCtxCreate_v2 && cuMemAlloc_v2 && cuMemFree_v2) {
            void *ctx; unsigned long long ptr;
            CHECK(cuCtxCreate_v2(&ctx, 0, dev));
            CHECK(cuMemAlloc_v2(&ptr, 1 << 20));
            CHECK(cuMemFree_v2(ptr));
            printf("device %d allocated\n", i);
        }
    }
    return 0;
}
