"""WSL2 and Jetson/Tegra nodes: no NVIDIA kernel module, so their own checks instead of the driver's.

A WSL2 node reaches Windows' driver through ``/dev/dxg`` and its driver
store; a Jetson's integrated GPU is ``/dev/nvhost-*`` and what its CSV lists
name (docs/platforms.md). There the ``driver``, ``devices`` and
``libraries`` checks look for what such a node never has, so they say they
do not apply, and the checks here look at what containers get instead. The
platform is the one :mod:`nvct.edits.build` acts on (:func:`nvct.edits.wsl.is_wsl`,
then :func:`nvct.edits.csvmode.is_tegra`).
"""

from __future__ import annotations

import os
import stat

from nvct.base.errors import NvctError
from nvct.doctor.model import Context, Finding, fail, info, ok, warn
from nvct.edits import csvmode, wsl

WSL, TEGRA = "WSL2", "Tegra"

#: The groups that do not apply on these platforms, and why.
_NOT_APPLICABLE = {
    "driver": "no NVIDIA kernel module, /proc/driver/nvidia nor host NVML to check",
    "devices": "no /dev/nvidia* nodes: containers get the platform's own (see platform.*)",
    "libraries": "containers get the platform's files, not the ld cache's driver libraries (see platform.*)",
}
#: The driver-store files CUDA cannot work without.
_WSL_ESSENTIAL = ("libcuda.so.1.1", "libdxcore.so")


def platform(ctx: Context) -> str | None:
    """WSL2, Tegra, or None (a node with NVIDIA's kernel module, or one whose config does not load).

    A node with a WSL2 driver store but no ``/dev/dxg`` and no module counts as
    WSL2 here, so that the doctor names the missing device (nvct itself then
    finds no driver: ``platform.dxg`` says so).
    """
    def detect():
        driver = ctx.driver
        if driver is None:
            return None

        if wsl.is_wsl(driver):
            return WSL
        if csvmode.is_tegra(driver):
            return TEGRA
        if not os.path.isdir(os.path.join(driver.proc_root, "driver/nvidia")) and wsl.driver_stores(driver):
            return WSL
        return None

    return ctx.memo("platforms.platform", detect)


def not_applicable(ctx: Context, group: str, checks) -> list[Finding] | None:
    """One ``info`` per check of ``group`` when the group does not apply here, else None (run them)."""
    name = platform(ctx)
    if name is None or group not in _NOT_APPLICABLE:
        return None
    return [info(f"{group}.{c.__name__.removeprefix('check_').replace('_', '-')}",
                 f"not applicable on {name}: {_NOT_APPLICABLE[group]}") for c in checks]


def check_wsl(ctx: Context):
    if platform(ctx) != WSL:
        return

    driver = ctx.driver
    dxg = driver.dev_host_path(wsl.DXG)
    try:
        st = os.stat(dxg)
        seen = None if stat.S_ISCHR(st.st_mode) else "is not a character device"
    except OSError as e:
        seen = e.strerror
    if seen:
        yield fail("platform.dxg", f"WSL2 driver store present but {dxg}: {seen}: nvct finds no driver, and GPU "
                   "containers fail to start", "update WSL and the Windows NVIDIA driver (wsl --update, then "
                   "wsl --shutdown); /dev/dxg comes from WSL's kernel (dxgkrnl)")
    else:
        yield ok("platform.dxg", f"{dxg} is a character device ({os.major(st.st_rdev)}:{os.minor(st.st_rdev)})")
    stores = wsl.driver_stores(driver)
    found = {os.path.basename(path): path for path, _ in wsl.files(driver)} if stores else {}
    missing = [n for n in wsl.DRIVER_STORE_FILES if n not in found]
    lost = [n for n in missing if n in _WSL_ESSENTIAL]
    where = f"{', '.join(stores) or 'no NVIDIA driver store'} and {wsl.WSL_LIB}"
    if lost:
        yield fail("platform.driver-store", f"{', '.join(lost)} missing from {where}: CUDA cannot work in "
                   "containers", "reinstall the NVIDIA driver on Windows (WSL2 shares its driver store)")
    elif missing:
        yield warn("platform.driver-store", f"{', '.join(missing)} missing from {where}: containers get the other "
                   f"{len(found)} files", "update the NVIDIA driver on Windows")
    else:
        yield ok("platform.driver-store", f"all {len(found)} driver-store files found ({where})")


def check_tegra(ctx: Context):
    if platform(ctx) != TEGRA:
        return

    directory = csvmode.mount_spec_path(ctx.config)
    try:
        base, every = csvmode.csv_files(directory), csvmode.csv_files(directory, all_files=True)
    except NvctError as e:
        yield fail("platform.csv-files", str(e), f"check {directory}")
        return
    if not base:
        yield fail("platform.csv-files", f"Tegra board but no {', '.join(csvmode.BASE_FILES)} in {directory}: GPU "
                   "containers get nothing", "reinstall nvidia-l4t-core / nvidia-container (JetPack), or "
                   + ctx.set_command(csvmode.MOUNT_SPEC_PATH_KEY, "DIR"))
        return
    yield ok("platform.csv-files", f"{len(every)} CSV file(s) in {directory} "
             f"({', '.join(os.path.basename(f) for f in every)})")
    try:
        problems = csvmode.unresolved(ctx.driver, every)
        by_type = csvmode.entries(every)
    except NvctError as e:
        yield fail("platform.csv-entries", str(e), f"check {directory}")
        return
    if not problems:
        yield ok("platform.csv-entries", f"each of the {sum(map(len, by_type.values()))} CSV entries resolves in "
                 f"the driver root {ctx.driver.driver_root}")
        return
    seen = "; ".join(f"{kind} {path}: {why}" for kind, path, why in problems)
    fix = "reinstall the L4T packages that own them (dpkg -S PATH), or remove the lines"
    cuda = [p for k, p, _ in problems if k == "lib" and os.path.basename(p).startswith("libcuda.so")]
    no_device = by_type["dev"] and len([k for k, _, _ in problems if k == "dev"]) == len(by_type["dev"])
    if cuda or no_device:
        what = "the CUDA driver (libcuda)" if cuda else "any GPU device node"
        yield fail("platform.csv-entries", f"GPU containers get no {what}: {seen}", fix)
    else:  # a board's lists often name files of packages it lacks: the reference skips them too
        yield warn("platform.csv-entries", f"containers get the rest, without: {seen}", fix)

CHECKS = (check_wsl, check_tegra)
