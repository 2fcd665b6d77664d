/*
 * Shapes of the topology tables the node builder generates (simtopo_data.h)
 * from the topology JSON and compiles into the simulated libnvidia-ml.
 */
#ifndef NVCT_SIM_TOPO_H
#define NVCT_SIM_TOPO_H

struct sim_profile {
    unsigned int profile;          /* NVML_GPU_INSTANCE_PROFILE_* constant */
    unsigned int id;               /* profile id */
    unsigned int slices;
    unsigned int instance_count;
    unsigned int multiprocessors;
    unsigned long long memory_mib;
    unsigned int ci_profile;       /* constant of the full compute instance */
    const char *name;
    unsigned int capabilities;     /* NVML_GPU_INSTANCE_PROFILE_CAPS_* (v3 profile info) */
};

struct sim_gpu {
    unsigned int minor;
    const char *uuid;
    const char *name;
    unsigned int domain, bus, device, function;
    unsigned int pci_device_id, pci_subsystem_id;
    int brand, architecture, cc_major, cc_minor;
    unsigned long long memory_mib, reserved_mib;
    unsigned int multiprocessors, cores;
    const char *vbios, *board_part_number, *serial;
    unsigned int power_limit_mw;
    int mig_capable, mig_enabled;
    int persistence_mode;              /* NVML_FEATURE_ENABLED (1) or DISABLED (0) */
    unsigned int max_mig_devices;
    int mig_first, mig_count;          /* into sim_migs */
    int profile_first, profile_count;  /* into sim_profiles */
};

struct sim_mig {
    int gpu;                           /* into sim_gpus */
    unsigned int gi, ci;
    unsigned int gi_profile, gi_profile_id, ci_profile;
    unsigned int placement_start, placement_size, slices, multiprocessors;
    unsigned long long memory_mib;
    const char *uuid, *name, *profile_name;
    unsigned int gi_cap_minor, ci_cap_minor;
};

#endif
