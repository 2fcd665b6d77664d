"""Feature flags and hook selection of CDI generation, as the reference's nvcdi has them.

``cdi generate`` takes them as ``--feature-flag``, ``--disable-hook`` and
``--enable-hook``; jit-cdi (and the automatic ``runtime.nvidia.com/gpu``
devices) read ``nvidia-container-runtime.modes.jit-cdi.nvcdi-feature-flags``
and ``nvcdi-disable-hooks``. A name nvct does not know, or knows but does
not implement, is warned about, never dropped in silence.

nvct joins the in-container hooks into one ``hook chain``: disabling a hook
drops its step from the chain, and the chain goes when no step is left.
"""

from __future__ import annotations

import os
import stat

from nvct.config.keys import Settings
from nvct.edits.model import ContainerEdits

TYPE_CHECKING = False  # typing costs an import
if TYPE_CHECKING:
    from typing import Iterable

DISABLE_IPC = "disable-ipc-discoverer"
EXPLICIT_LIBRARIES = "enable-explicit-driver-libraries"
DISABLE_NVSANDBOXUTILS = "disable-nvsandboxutils"
NO_ADDITIONAL_GIDS = "no-additional-gids-for-device-nodes"
COHERENT_ANNOTATIONS = "enable-coherent-annotations"
MULTIPLE_CSV_DEVICES = "disable-multiple-csv-devices"

#: Flags with an effect in nvct. nvct never loads libnvidia-sandboxutils, so that flag holds already.
FEATURES = (DISABLE_IPC, EXPLICIT_LIBRARIES, DISABLE_NVSANDBOXUTILS, NO_ADDITIONAL_GIDS, COHERENT_ANNOTATIONS)
#: The reference's flags nvct does not implement: warned about.
UNIMPLEMENTED = {MULTIPLE_CSV_DEVICES: "nvct's csv mode gives one device (all)"}
#: The specs the coherent-annotations flag adds: file-name infix (and class suffix), coherent or not.
COHERENCE_SPECS = ((".coherent", True), (".noncoherent", False))
#: The reference's older spelling.
_ALIASES = {"disable-nvsandbox-utils": DISABLE_NVSANDBOXUTILS}

ALL_HOOKS = "all"
#: The reference's hook names; ``chmod`` is off unless enabled, as there.
HOOKS = ("create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification",
         "chmod", "update-application-profile", "apply-cuda-memory-limits", "check-requirements")
DEFAULT_DISABLED = ("chmod",)

#: Libraries the explicit-libraries flag adds, by the name the reference looks up.
EXPLICIT_LIBRARY_NAMES = (
    "libEGL.so", "libGL.so", "libGLESv1_CM.so", "libGLESv2.so", "libGLX.so", "libGLdispatch.so",
    "libOpenCL.so", "libOpenGL.so", "libnvidia-api.so", "libnvidia-egl-xcb.so", "libnvidia-egl-xlib.so",
)

FEATURES_KEY = Settings.jit_cdi_feature_flags.name
HOOKS_KEY = Settings.jit_cdi_disable_hooks.name


class Generation:
    """The feature flags and hook choices of one generation (validated, warned about once)."""

    __slots__ = ("features", "disabled", "enabled")

    def __init__(self, features: Iterable[str] = (), disabled_hooks: Iterable[str] = (),
                 enabled_hooks: Iterable[str] = (), *, what: str = "--feature-flag",
                 hooks_what: str = "--disable-hook"):
        from nvct.base.errors import NvctError
        from nvct.base.log import logger

        self.features = frozenset(_ALIASES.get(f, f) for f in features)
        for flag in sorted(self.features - set(FEATURES)):
            reason = UNIMPLEMENTED.get(flag, "not a feature flag nvct or the reference knows")
            logger.warning("%s %s ignored: %s", what, flag, reason)
        enabled = set(enabled_hooks)
        if ALL_HOOKS in enabled:
            raise NvctError("--enable-hook all: enabling all hooks is not supported")
        disabled = set(disabled_hooks)
        for name, where in sorted([(n, hooks_what) for n in disabled - {ALL_HOOKS}]
                                  + [(n, "--enable-hook") for n in enabled]):
            if name not in HOOKS:
                logger.warning("%s %s ignored: not a hook name (one of %s, or all)", where, name, ", ".join(HOOKS))
        self.disabled = frozenset(disabled | set(DEFAULT_DISABLED))
        self.enabled = frozenset(enabled)

    def with_disabled(self, *hooks: str) -> Generation:
        """A copy with ``hooks`` disabled too (an explicit ``--enable-hook`` still wins)."""
        copy = object.__new__(Generation)
        copy.features, copy.enabled = self.features, self.enabled
        copy.disabled = self.disabled | set(hooks)
        return copy

    @property
    def ipc(self) -> bool:
        """Whether the driver's IPC sockets (persistenced, fabricmanager, MPS) are mounted."""
        return DISABLE_IPC not in self.features

    @property
    def all_hooks_off(self) -> bool:
        return ALL_HOOKS in self.disabled and not self.enabled

    def hook_enabled(self, name: str) -> bool:
        if name in self.enabled:
            return True
        if name in self.disabled:
            return False
        return ALL_HOOKS not in self.disabled

    def explicit_libraries(self, driver) -> list:
        """The :data:`EXPLICIT_LIBRARY_NAMES` the driver root's ld cache has, when the flag is on."""
        if EXPLICIT_LIBRARIES not in self.features:
            return []
        from nvct.discover.driver import Library, resolve_in_root

        out, seen = [], set()
        for entry in driver.cache_entries():
            base = entry.key.split(".so", 1)[0] + ".so"
            if base not in EXPLICIT_LIBRARY_NAMES or entry.arch != driver.arch:
                continue
            real = resolve_in_root(driver.driver_root, entry.value)
            if real is None or real in seen:
                continue
            seen.add(real)
            out.append(Library(real, entry.key, "explicit", entry.arch))
        return sorted(out, key=lambda lib: lib.path)

    def finish(self, edits: ContainerEdits, *, gids: bool = True, keep=("bind-mount",)) -> ContainerEdits:
        """Drop the disabled hooks' steps from nvct's chain; add the device nodes' group ids.

        ``gids=False``: never (specs written to disk: additional gids need CDI
        0.7.0, which podman 4.3 cannot read; docs/cdi.md, "Differences from the reference").
        """
        from nvct.edits.model import as_chain

        hooks = []
        for hook in edits.hooks:
            chain = as_chain(hook)
            if chain is None:
                if not self.all_hooks_off:
                    hooks.append(hook)
                continue
            kept = tuple(s for s in chain.steps if (s.name in keep and not self.all_hooks_off)
                         or (s.name not in keep and self.hook_enabled(s.name)))
            if kept:
                hooks.append(chain.replace(steps=kept))
        edits.hooks = hooks
        if gids and NO_ADDITIONAL_GIDS not in self.features:
            for gid in device_node_gids(edits):
                if gid not in edits.additional_gids:
                    edits.additional_gids.append(gid)
        return edits


def coherence_groups(driver, device_ids) -> list[tuple[str, list[str]]]:
    """``(infix, GPU UUIDs)`` of the selected whole GPUs, coherent (ATS) or not, as NVML says.

    The reference's coherent-annotations flag writes each group as a spec of
    its own, class ``<class><infix>``, beside the full one; MIG devices are in
    neither.
    """
    from nvct.edits.devices import select

    gpus = select(tuple(device_ids), driver, what="--device-id").gpus
    if not gpus:
        return []
    with driver.nvml() as nvml:
        coherent = {gpu.uuid: nvml.coherent(nvml.handle_by_uuid(gpu.uuid)) for gpu in gpus}
    groups = [(infix, [u for u, c in coherent.items() if c is want]) for infix, want in COHERENCE_SPECS]
    return [(infix, uuids) for infix, uuids in groups if uuids]


def device_node_gids(edits: ContainerEdits) -> list[int]:
    """The group of each device node a container user could not open by its mode alone.

    As the reference: a node whose group is not root and whose mode lacks
    world read and write gives its group as an additional gid, so that a
    non-root container user in that group (``render``, ``video``) keeps access.
    """
    out: list[int] = []
    for node in edits.device_nodes:
        try:
            st = os.stat(node.host_path or node.path)
        except OSError:
            continue
        if st.st_gid == 0 or stat.S_IMODE(st.st_mode) & 0o006 == 0o006:
            continue
        if st.st_gid not in out:
            out.append(st.st_gid)
    return out


def for_jit(config) -> Generation:
    """jit-cdi's choices, from ``nvcdi-feature-flags`` and ``nvcdi-disable-hooks``."""
    return Generation(_strings(config, config.jit_cdi_feature_flags, FEATURES_KEY),
                      _strings(config, config.jit_cdi_disable_hooks, HOOKS_KEY),
                      what=FEATURES_KEY, hooks_what=HOOKS_KEY)


def _strings(config, value, key: str) -> list[str]:
    from nvct.base.errors import ConfigError

    value = value or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{config.path or 'config'}: {key}: must be a list of strings")
    return value
