/*
 * dlopen-probe: dlopen() each SONAME given on the command line, the way an
 * application inside the container would, and report where it came from.
 *
 *   ok <soname> <path the dynamic loader resolved>
 *   fail <soname> <dlerror() message>
 *
 * Exit status: 0 if every name loaded, 1 if any failed, 2 on usage error.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int failed = 0;

    if (argc < 2) {
        fprintf(stderr, "usage: %s SONAME...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        void *handle = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
        if (handle == NULL) {
            const char *err = dlerror();
            printf("fail %s %s\n", argv[i], err ? err : "unknown error");
            failed = 1;
            continue;
        }
        struct link_map *map = NULL;
        const char *path = "?";
        if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != NULL
            && map->l_name != NULL && map->l_name[0] != '\0')
            path = map->l_name;
        printf("ok %s %s\n", argv[i], path);
    }
    fflush(stdout);
    return failed;
}
