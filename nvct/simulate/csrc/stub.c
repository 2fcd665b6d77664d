/*
 * Body of every simulated driver library that has no behaviour of its own
 * (libnvidia-glcore, libnvoptix, ...): real ELF, real SONAME, real
 * DT_NEEDED, and the driver version it belongs to.
 */
__attribute__((visibility("default"))) const char nvct_simulated_driver_version[] = SIM_DRIVER_VERSION;
