"""Driver libraries: each one the ld cache lists must be of the kernel module's version.

nvct (like libnvidia-container) silently leaves out a cache entry whose file
is of another driver version, so a half-upgraded node gives containers no
libcuda -- these checks say so, and which file is at fault.
"""

from __future__ import annotations

import os
import re

from nvct.discover.catalog import COMPAT32_ARCHES, LIBRARIES
from nvct.discover.rootpath import resolve_in_root
from nvct.doctor.model import LIB_DIRS as _LIB_DIRS, Context, fail, info, ok, warn

_LIBRARY_CAPABILITY = {name: cap for cap, names in LIBRARIES.items() for name in names}
_VERSION_RE = re.compile(r"\.so\.(\d+\.\d+(?:\.\d+)?)$")

#: Libraries without which nothing works, and the error a container shows then.
REQUIRED = {
    "libnvidia-ml.so.1": ("libraries.nvml", "utility",
                          "containers fail with \"load library failed: libnvidia-ml.so.1: cannot open "
                          "shared object file\" and nvidia-smi finds no NVML"),
    "libcuda.so.1": ("libraries.cuda", "compute", "CUDA applications in containers find no libcuda.so.1"),
}


class _Lib:
    """One cache entry of a driver library, resolved under the driver root."""

    def __init__(self, entry, real: str | None, capability: str):
        self.key = entry.key
        self.link = entry.value
        self.arch = entry.arch
        self.real = real
        self.capability = "compat32" if entry.arch in COMPAT32_ARCHES else capability
        match = _VERSION_RE.search(real or "")
        self.version = match.group(1) if match else None


def _scan(ctx: Context) -> list[_Lib]:
    return ctx.memo("libraries", lambda: _resolve_all(ctx))


def _resolve_all(ctx: Context) -> list[_Lib]:
    out = []
    for entry in ctx.ldcache:
        capability = _LIBRARY_CAPABILITY.get(entry.key.split(".so", 1)[0] + ".so")
        if capability is None or entry.arch not in ctx.driver.arches:
            continue
        out.append(_Lib(entry, resolve_in_root(ctx.driver.driver_root, entry.value), capability))
    return out


def _ldconfig(ctx: Context) -> str:
    root = ctx.driver.driver_root
    return "ldconfig" if root in ("", "/") else f"ldconfig -r {root}"


def check_ldcache(ctx: Context):
    if ctx.driver is None:
        yield ctx.skipped("libraries.ldcache", "nvct's config does not load (see config.file)")
        return
    if ctx.ldcache is None and (why := ctx.missing_root("driver")):
        yield ctx.skipped("libraries.ldcache", why)
        return
    if ctx.ldcache is None:
        yield fail("libraries.ldcache", ctx.ldcache_error or "", _ldconfig(ctx))
        return
    libs = _scan(ctx)
    yield ok("libraries.ldcache", f"{ctx.driver.ldcache_path}: {len(ctx.ldcache)} entries, "
             f"{len({lib.real for lib in libs if lib.real})} NVIDIA driver libraries")


def check_versions(ctx: Context):
    """One finding per capability; one for the whole driver when none matches the module."""
    if ctx.ldcache is None or ctx.version is None:
        yield ctx.skipped("libraries.versions", "no ld cache or no driver version (see above)")
        return
    if ctx.empty_driver_root:
        yield ctx.skipped("libraries.versions", f"{ctx.empty_driver_root} (see config.roots)")
        return
    libs = _scan(ctx)
    version = ctx.version
    if libs and not any(lib.version == version for lib in libs):
        found = sorted({lib.version for lib in libs if lib.version})
        yield fail("libraries.versions",
                   f"every driver library in {ctx.driver.ldcache_path} is {', '.join(found) or 'unversioned'}, "
                   f"the kernel module is {version}: the driver was changed without reloading the module",
                   f"reboot (or unload and reload the module: rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia "
                   f"&& modprobe nvidia nvidia-uvm); or reinstall driver {version}'s libraries")
        return
    for capability in list(LIBRARIES) + ["compat32"]:
        yield from _capability(ctx, capability, [lib for lib in libs if lib.capability == capability])


def _capability(ctx: Context, capability: str, libs: list[_Lib]):
    id = f"libraries.{capability}"
    version = ctx.version
    good = {lib.real for lib in libs if lib.version == version}
    dangling = [lib for lib in libs if lib.real is None]
    other: dict = {}
    for lib in libs:
        if lib.real is not None and lib.version != version:
            # Several keys (libcuda.so.1, libcuda.so) may lead to one file: name the longest.
            if lib.real not in other or len(lib.key) > len(other[lib.real].key):
                other[lib.real] = lib
    by_version: dict = {}
    for lib in other.values():
        by_version.setdefault(lib.version, []).append(lib)
    for found, group in sorted(by_version.items(), key=lambda item: str(item[0])):
        if len(group) == 1:
            lib = group[0]
            yield fail(id, f"{lib.key} ({lib.arch}) resolves to {lib.real}, of driver {found or '?'}, but the "
                       f"kernel module is {version}: containers do not get it", _mismatch_fix(ctx, lib))
            continue
        names = sorted(f"{lib.key} ({lib.arch})" for lib in group)
        yield fail(id, f"{len(group)} {capability} libraries are of driver {found or '?'}, but the kernel module "
                   f"is {version}: containers do not get {_some(names)}",
                   f"install driver {version}'s user-space libraries (or, if driver {found} was just installed, "
                   f"reboot to load its module), then {_ldconfig(ctx)}")
    if dangling:
        yield warn(id, f"{ctx.driver.ldcache_path} lists {_some(f'{lib.key} => {lib.link}' for lib in dangling)}, "
                   f"which do not exist", _ldconfig(ctx))
    if other or dangling:
        return
    if not good:
        yield info(id, f"no {capability} libraries in {ctx.driver.ldcache_path} "
                   f"(containers asking for {capability} get none)")
        return
    noun = "library" if len(good) == 1 else "libraries"
    yield ok(id, f"{len(good)} {capability} {noun}, all {version}")


def _mismatch_fix(ctx: Context, lib: _Lib) -> str:
    assert lib.real is not None  # a library of another version: a file was found
    directory = os.path.dirname(lib.real)
    base = os.path.basename(lib.real)[: -len(lib.version or "")] if lib.version else None
    wanted = f"{base}{ctx.version}" if base else None
    if wanted and os.path.isfile(ctx.driver.host_path(f"{directory}/{wanted}")) \
            and os.path.basename(lib.link) != os.path.basename(lib.real):
        link = ctx.driver.host_path(lib.link)
        return f"ln -sf {wanted} {link} && {_ldconfig(ctx)}"
    return (f"install driver {ctx.version}'s user-space libraries (or remove "
            f"{ctx.driver.host_path(lib.real)}), then {_ldconfig(ctx)}")


def check_required(ctx: Context):
    """libnvidia-ml.so.1 and libcuda.so.1 must be in the cache, or containers break."""
    if ctx.ldcache is None or ctx.version is None:
        for id, _, _ in REQUIRED.values():
            yield ctx.skipped(id, "no ld cache or no driver version (see above)")
        return
    if ctx.empty_driver_root:
        for id, _, _ in REQUIRED.values():
            yield ctx.skipped(id, f"{ctx.empty_driver_root} (see config.roots)")
        return
    cache = ctx.driver.ldcache_path
    for soname, (id, capability, symptom) in REQUIRED.items():
        entries = [lib for lib in _scan(ctx) if lib.arch == ctx.driver.arch and lib.key == soname]
        if any(lib.real for lib in entries):
            yield ok(id, f"{soname} is in {cache}")
            continue
        on_disk = _on_disk(ctx, soname)
        if on_disk:
            fix = _ldconfig(ctx)
            where = f"; {on_disk} exists but the cache was not rebuilt"
        else:
            fix = f"install driver {ctx.version}'s {capability} libraries ({soname}), then {_ldconfig(ctx)}"
            where = ""
        if entries:
            seen = f"{cache} lists {soname} => {entries[0].link}, which does not exist{where}"
        else:
            seen = f"{soname} is not in {cache}{where}"
        yield fail(id, f"{seen}: {symptom}", fix)


def check_uncached(ctx: Context):
    """Driver libraries on disk that the cache does not list: ldconfig was not run."""
    if ctx.ldcache is None or ctx.version is None:
        yield ctx.skipped("libraries.uncached", "no ld cache or no driver version (see above)")
        return
    cached = {lib.real for lib in _scan(ctx) if lib.real}
    missing = []
    for directory in _LIB_DIRS:
        try:
            names = os.listdir(ctx.driver.host_path(directory))
        except OSError:
            continue
        for name in sorted(names):
            base, sep, version = name.partition(".so.")
            if sep and version == ctx.version and base + ".so" in _LIBRARY_CAPABILITY \
                    and f"{directory}/{name}" not in cached:
                missing.append(f"{directory}/{name}")
    if missing:
        yield warn("libraries.uncached",
                   f"{len(missing)} driver libraries on disk are not in {ctx.driver.ldcache_path}: "
                   f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}", _ldconfig(ctx))
    else:
        yield ok("libraries.uncached", f"every driver {ctx.version} library on disk is in the cache")


def _some(items, shown: int = 4) -> str:
    items = list(items)
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def _on_disk(ctx: Context, soname: str) -> str | None:
    base = soname.split(".so", 1)[0]
    for directory in _LIB_DIRS[:_LIB_DIRS.index("/usr/lib") + 1]:  # the 64-bit ones
        path = f"{directory}/{base}.so.{ctx.version}"
        if os.path.isfile(ctx.driver.host_path(path)):
            return path
    return None


CHECKS = (check_ldcache, check_versions, check_required, check_uncached)
