"""CDI specs: valid, and fresh -- made for this driver version and these GPUs.

A spec is a snapshot: after a driver upgrade its library paths name files
that no longer exist (or of the old version), and after a GPU swap its UUIDs
name GPUs that are gone. Either way containers that ask for its devices fail.
"""

from __future__ import annotations

import os
import re

from nvct.base.errors import NvctError
from nvct.cdi.registry import Registry
from nvct.config.file import Config
from nvct.discover.driver import OWN_VERSION_LIBRARIES
from nvct.doctor.devices import expected_nodes
from nvct.doctor.model import Context, fail, info, ok, warn
from nvct.edits.model import is_sealed

_SO_VERSION = re.compile(r"\.so\.(\d+\.\d+(?:\.\d+)?)$")
_FIRMWARE_VERSION = re.compile(r"/firmware/nvidia/(\d+\.\d+(?:\.\d+)?)/")
_DEFAULT_SPEC = "/etc/cdi/nvidia.yaml"


def spec_dirs(ctx: Context) -> list[str]:
    if ctx.options.cdi_dirs:
        return list(ctx.options.cdi_dirs)

    dirs = (ctx.config or Config(env={})).cdi_spec_dirs or ()
    return [dirs] if isinstance(dirs, str) else list(dirs)


def check_specs(ctx: Context):
    dirs = spec_dirs(ctx)
    registry = ctx.memo("cdi", lambda: Registry(dirs))
    for path, reasons in registry.errors.items():
        for reason in reasons:
            yield fail("cdi.specs", f"{path}: {reason} (CDI runtimes ignore its devices)",
                       f"correct or remove {path} (nvct cdi generate --output {path} writes a fresh one)")
    nvidia = _nvidia_specs(registry)
    if not nvidia:
        mode = ctx.config.mode if ctx.config is not None else None
        make = fail if mode == "cdi" else info
        yield make("cdi.specs", f"no NVIDIA CDI spec in {', '.join(dirs) or 'no directory'}"
                   + (" but the shim is in cdi mode: GPU containers fail to start (unresolvable CDI devices)"
                      if mode == "cdi" else ""),
                   f"nvct cdi generate --output {os.path.join(dirs[0], 'nvidia.yaml') if dirs else _DEFAULT_SPEC}")
        return
    kinds = sorted({s.kind for s in nvidia})
    yield ok("cdi.specs", f"{len(nvidia)} NVIDIA spec(s) in {', '.join(dirs)} ({', '.join(kinds)}), "
             f"{sum(len(s.devices) for s in nvidia)} devices")


def check_fresh(ctx: Context):
    registry = ctx.memo("cdi", lambda: Registry(spec_dirs(ctx)))
    specs = _nvidia_specs(registry)
    if not specs:
        yield ctx.skipped("cdi.fresh", "no NVIDIA CDI spec (see cdi.specs)")
        return
    for spec in specs:
        yield from _fresh(ctx, spec)


def _fresh(ctx: Context, spec):
    fix = f"nvct cdi generate --output {spec.path}" + _kind_options(spec)
    edits = [spec.edits] + [d.get("containerEdits") or {} for d in spec.devices.values()]
    problems = 0
    missing = sorted({p for e in edits for p in _host_paths(e) if not os.path.lexists(p)})
    if missing:
        problems += 1
        yield fail("cdi.fresh", f"{spec.path}: {len(missing)} host path(s) do not exist, e.g. "
                   f"{', '.join(missing[:3])} (containers using it fail to start)", fix)
    root = _driver_root(edits)
    here = os.path.normpath(ctx.driver.driver_root) if ctx.driver is not None else None
    if root is not None and here is not None and root != here:
        problems += 1
        yield warn("cdi.fresh", f"{spec.path} was generated for driver root {root}, but nvct's driver root "
                   f"(nvidia-container-cli.root) is {here}: containers given its devices get {root}'s files",
                   fix + " (once nvidia-container-cli.root names the driver's directory)")
    versions = sorted({v for e in edits for v in _versions(e)})
    if ctx.version and any(v != ctx.version for v in versions):
        problems += 1
        other = ", ".join(v for v in versions if v != ctx.version)
        yield fail("cdi.fresh", f"{spec.path} was made for driver {other}, the kernel module is {ctx.version}", fix)
    driver_numbers = _driver_numbers(ctx)
    wrong = sorted({m for e in edits for n in e.get("deviceNodes") or () if (m := _node_mismatch(n, driver_numbers))})
    if wrong:
        problems += 1
        yield fail("cdi.fresh", f"{spec.path}: device numbers differ from the driver's: {'; '.join(wrong[:3])} "
                   "(containers get the spec's numbers)", fix)
    if ctx.gpus is not None:
        for finding in _uuids(ctx, spec, fix):
            problems += 1
            yield finding
    if not problems:
        checked = "host paths, driver version" + (", GPU UUIDs" if ctx.gpus is not None else "")
        yield ok("cdi.fresh", f"{spec.path} ({spec.kind}, {len(spec.devices)} devices) matches this node: {checked}")


def _uuids(ctx: Context, spec, fix: str):
    names = {n.lower() for n in spec.devices}
    have = {g.uuid.lower(): g for g in ctx.gpus}
    gone = sorted(n for n in names if n.startswith("gpu-") and n not in have)
    if gone:
        yield fail("cdi.fresh", f"{spec.path} names GPU(s) this node does not have: {', '.join(gone[:3])}", fix)
    if ctx.options.deep:
        try:
            migs = {u.lower() for u in ctx.driver.mig_uuids}
        except Exception:  # noqa: BLE001 - NVML trouble is driver.nvml's finding
            migs = None
        stale = sorted(n for n in names if n.startswith("mig-") and migs is not None and n not in migs)
        if stale:
            yield fail("cdi.fresh", f"{spec.path} names MIG device(s) this node does not have: "
                       f"{', '.join(stale[:3])} (containers asking for them start without a MIG device)", fix)
    if any(n.startswith("gpu-") for n in names):
        new = [g for u, g in have.items() if u not in names]
        if new:
            yield warn("cdi.fresh", f"{spec.path} lacks GPU(s) {', '.join(str(g.index) for g in new)} "
                       f"({', '.join(g.uuid for g in new[:3])})", fix)


def _nvidia_specs(registry):
    return [s for s in registry.specs if s.vendor == "nvidia.com" or s.vendor.endswith(".nvidia.com")]


def _host_paths(edits):
    """Host paths a runtime opens: a device node with its numbers is made from them, not from the host's."""
    for m in edits.get("mounts") or ():
        yield m["hostPath"]
    for n in edits.get("deviceNodes") or ():
        if not n.get("major"):
            yield n.get("hostPath") or n["path"]
    for h in edits.get("hooks") or ():
        yield h["path"]


def _driver_root(edits) -> str | None:
    """The driver root a spec was generated for: what its driver libraries' host paths add to their
    container paths (``ROOT/usr/lib/.../libcuda.so.V`` at ``/usr/lib/.../libcuda.so.V``)."""
    for e in edits:
        for m in e.get("mounts") or ():
            host, target = m.get("hostPath") or "", m.get("containerPath") or ""
            name = os.path.basename(target)
            if name.startswith(("libcuda.so.", "libnvidia-ml.so.")) and host.endswith(target) and target != "/":
                return os.path.normpath(host[: len(host) - len(target)] or "/")
    return None


def _versions(edits):
    for m in edits.get("mounts") or ():
        for path in (m["hostPath"], m["containerPath"]):
            if os.path.basename(path).startswith(OWN_VERSION_LIBRARIES):  # e.g. libnvidia-egl-gbm.so.1.1.1
                continue
            match = _SO_VERSION.search(path) or _FIRMWARE_VERSION.search(path)
            if match:
                yield match.group(1)
    for h in edits.get("hooks") or ():
        args = list(h.get("args") or ())
        for i, arg in enumerate(args[:-1]):
            if arg == "--host-driver-version":
                yield args[i + 1]


def _driver_numbers(ctx: Context) -> dict:
    """Each NVIDIA node's numbers as the driver registers them (procfs), by container path."""
    if ctx.version is None or ctx.gpus is None:
        return {}
    try:
        return {n.path: (n.major, n.minor) for n in expected_nodes(ctx)}
    except NvctError:
        return {}


def _node_mismatch(node, driver_numbers: dict) -> str | None:
    """A spec node whose numbers are not the driver's: runtimes make the container's node from them.

    Nodes the driver's procfs does not number (DRM) are compared with the host's node.
    """
    major = node.get("major")
    if not major:
        return None
    numbers = (major, node.get("minor") or 0)
    have = driver_numbers.get(node["path"])
    where = "for the driver"
    if have is None:
        where = "on the host"
        try:
            st = os.stat(node.get("hostPath") or node["path"])
        except OSError:
            return None  # a missing host path is reported as such where it matters
        have = (os.major(st.st_rdev), os.minor(st.st_rdev))
    if have != numbers:
        return f"{node['path']} is {numbers[0]}:{numbers[1]} in the spec, {have[0]}:{have[1]} {where}"
    return None


def _kind_options(spec) -> str:
    out = ""
    if spec.vendor != "nvidia.com":
        out += f" --vendor {spec.vendor}"
    if spec.cls != "gpu":
        out += f" --class {spec.cls}"
    return out


def check_hook_env(ctx: Context):
    """Every spec's hooks fix their env: without one, runc runs a createContainer hook with the
    container's environment in its rootfs (CVE-2025-23266), whoever's spec it is."""
    registry = ctx.memo("cdi", lambda: Registry(spec_dirs(ctx)))
    bad = 0
    for spec in registry.specs:
        edits = [spec.raw.get("containerEdits") or {}] + [d.get("containerEdits") or {}
                                                           for d in spec.raw.get("devices") or ()]
        hooks = [h for e in edits for h in e.get("hooks") or () if not is_sealed(h)]
        if hooks:
            bad += 1
            yield warn("cdi.hook-env", f"{spec.path}: {len(hooks)} hook(s) without env, e.g. {hooks[0].get('path')} "
                       f"({hooks[0].get('hookName')}): under runc it runs with the container's environment",
                       f"regenerate it (nvct cdi generate --output {spec.path}), or "
                       f"nvct cdi transform root --from / --input {spec.path} --output {spec.path} "
                       "(gives hooks a fixed env)")
    if registry.specs and not bad:
        yield ok("cdi.hook-env", f"every hook of {len(registry.specs)} spec(s) has a fixed env")


def check_writable_mounts(ctx: Context):
    """No spec lists a read-write bind mount of a host directory: podman, containerd and cri-o
    sort spec mounts by depth, so it comes before deeper targets, and an image symlink into it
    makes the runtime create those in the host's directory (as the reference's /tmp/nvidia-mps)."""
    registry = ctx.memo("cdi", lambda: Registry(spec_dirs(ctx)))
    bad = 0
    for spec in registry.specs:
        edits = [spec.raw.get("containerEdits") or {}] + [d.get("containerEdits") or {}
                                                           for d in spec.raw.get("devices") or ()]
        found = [m for e in edits for m in e.get("mounts") or ()
                 if "ro" not in (m.get("options") or ()) and os.path.isdir(m.get("hostPath") or "")]
        if found:
            bad += 1
            mount = found[0]
            if spec in _nvidia_specs(registry):
                fix = (f"nvct cdi generate --output {spec.path}{_kind_options(spec)} "
                       "(its hook mounts the MPS directory last)")
            else:
                fix = "ask the spec's vendor for one without read-write directory mounts"
            yield warn("cdi.writable-mounts",
                       f"{spec.path}: mounts host directory {mount['hostPath']} read-write at "
                       f"{mount['containerPath']} ({len(found)} such mount(s)): CDI runtimes mount it before "
                       "deeper targets, so an image symlink into it has them created in that host directory", fix)
    if registry.specs and not bad:
        yield ok("cdi.writable-mounts", f"no spec of {len(registry.specs)} mounts a host directory read-write")


CHECKS = (check_specs, check_fresh, check_hook_env, check_writable_mounts)
