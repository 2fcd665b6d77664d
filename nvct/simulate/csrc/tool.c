/*
 * The driver's other utilities (nvidia-persistenced, nvidia-cuda-mps-control,
 * nv-fabricmanager, ...): on a simulated node there is nothing for them to
 * manage, so they answer --version and otherwise exit successfully.
 */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    int i;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-v") == 0) {
            printf("%s:  version %s\n", name, SIM_DRIVER_VERSION);
            return 0;
        }
    }
    return 0;
}
