"""containerd's ``config.toml``, versions 1 to 4.

Each version keeps the CRI runtimes under its own plugin: ``plugins.cri`` (v1,
or no ``version`` key), ``plugins."io.containerd.grpc.v1.cri"`` (v2) and
``plugins."io.containerd.cri.v1.runtime"`` (v3 and v4, containerd 2.x). A
later version is refused: its layout is unknown, and a runtime written where
containerd does not look would be silently missing. A new runtime
copies the options of the default runtime (else runc, else crun), so settings
such as ``SystemdCgroup`` carry over, and runs ``options.BinaryName``.

Drop-in files (v2 and later) are read through the main file's ``imports``.
containerd 1.x replaces a plugin's whole section with the last file's, so a
version 2 drop-in starts from a copy of the main file's CRI section: without
it, the main file's runc runtime and every other CRI setting would vanish.
containerd 2.x merges an imported plugin section key by key, so a version 3
drop-in (containerd 2.x only) holds only nvct's keys. A copy goes stale when
the main file changes later: each ``configure`` brings it up to date again,
and ``nvct doctor`` reports the keys where it differs (:func:`cri_drift`).
"""

from __future__ import annotations

import copy
import fnmatch
import glob
import os
from typing import Any

from nvct.base.errors import ConfigError
from nvct.engines.document import MISSING, Document, TomlDocument
from nvct.engines.engine import Engine, get_plain, get_table, read_file

#: The CRI plugin holding the runtimes, per config version (containerd 2.0 wrote 3, 2.3 writes 4).
PLUGINS = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime",
           4: "io.containerd.cri.v1.runtime"}


def plugin_name(version: int) -> str:
    """The CRI runtime plugin of a config ``version`` (one :func:`config_version` accepted)."""
    return PLUGINS[version]


def config_version(data: dict, what: str, default: int) -> int:
    """The config's version: none at all is v1, an empty config is ``default``."""
    if not data:
        return default
    version = data.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise ConfigError(f"{what}: version must be an integer, not {version!r}")
    if version not in PLUGINS:
        raise ConfigError(f"{what}: unsupported containerd config version {version} "
                          f"(expected one of {', '.join(map(str, PLUGINS))})")
    return version


class ContainerdEngine(Engine):
    name = "containerd"
    default_config = "/etc/containerd/config.toml"
    default_drop_in = "/etc/containerd/conf.d/99-nvidia.toml"

    def __init__(self, config_path: str, **kwargs: Any):
        self._based = False
        super().__init__(config_path, **kwargs)

    def open(self, path: str) -> Document:
        doc = TomlDocument(path, read_file(path))
        if path == self.config_path:
            self.version = config_version(doc.data(), path, self.options.config_version)
            self.plugin = plugin_name(self.version)
        return doc

    def _check_drop_in(self, drop_in, explicit):
        drop_in = super()._check_drop_in(drop_in, explicit)
        src_version = config_version(self.source, "containerd config source", self.version)
        self.source_plugin = plugin_name(src_version)
        if not self.main.data() and src_version > self.version:  # a new file in the daemon's own version
            self.version, self.plugin = src_version, self.source_plugin
        if drop_in and self.version == 1:
            if explicit:
                raise ConfigError(f"{self.config_path}: containerd config version 1 cannot import "
                                  f"drop-in files; pass --drop-in-config='' to edit it in place")
            self.notes.append(f"{self.config_path} is a version 1 config (no drop-in files): editing it in place")
            return None
        return drop_in

    # --- keys ---
    def _key(self, *parts: str, plugin: str | None = None) -> tuple:
        return ("plugins", plugin or self.plugin) + parts

    @property
    def _runtimes(self) -> tuple:
        return self._key("containerd", "runtimes")

    @property
    def _default(self) -> tuple:
        return self._key("containerd", "default_runtime_name")

    # --- writing ---
    def add_runtime(self, name: str, path: str) -> None:
        self._ensure_base()
        entry = self._copied_options()
        if self.options.container_annotations:
            existing = entry.get("container_annotations") or []
            if not isinstance(existing, list):
                raise ConfigError(f"{self.config_path}: container_annotations is not a list")
            merged = list(self.options.container_annotations) + existing
            entry["container_annotations"] = list(dict.fromkeys(merged))
        if not entry.get("runtime_type"):
            entry["runtime_type"] = self.options.runtime_type
        options = entry.setdefault("options", {})
        if not isinstance(options, dict):
            raise ConfigError(f"{self.config_path}: runtime options are not a table")
        options["BinaryName"] = path
        if self.version == 1:
            options["Runtime"] = path
        get_table(self.dest, self._runtimes, self.dest.path)
        self.dest.set(self._runtimes + (name,), self._overrides(entry))

    def set_default(self, name: str) -> None:
        self._ensure_base()
        self.dest.set(self._default, name)

    def unset_default(self, name: str) -> None:
        for doc in self.documents():
            if doc.get(self._default) == name:
                doc.delete(self._default)

    def enable_cdi(self) -> None:
        self._ensure_base()
        self.dest.set(self._key("enable_cdi"), True)

    def remove_runtime(self, name: str) -> None:
        for doc in self.documents():
            doc.delete(self._runtimes + (name,))
            doc.prune(self._runtimes, stop=0)
        self.unset_default(name)
        if self.drop_in:
            self.dest.remove = True
            self._remove_import()
        self._drop_lone_version(self.main)

    def finish(self) -> None:
        if self.drop_in and self.dest.edits:
            self._add_import()

    def _ensure_base(self) -> None:
        """A new drop-in: version, and a copy of the source's CRI section."""
        if self._based:
            return
        self._based = True
        doc = self.dest
        if doc.get(("version",)) is MISSING and (self.drop_in or self.version != 1):
            doc.set(("version",), self.version)
        if not self.drop_in:
            return
        if doc.get(self._key()) is not MISSING:
            self._refresh_copy()
            return
        if self.version >= 3:  # containerd 2.x merges key by key: the drop-in needs only nvct's keys
            return
        section = get_plain(self.source, ("plugins", self.source_plugin))
        if isinstance(section, dict) and section:
            if self.source_plugin != self.plugin:
                self.notes.append(f"the config source is for plugin {self.source_plugin!r}, "
                                  f"not {self.plugin!r}: its CRI settings are not copied")
                return
            doc.set(self._key(), copy.deepcopy(section))

    def _refresh_copy(self) -> None:
        """Bring the drop-in's copy of the main file's CRI settings up to date."""
        main = get_plain(self.main.data(), ("plugins", self.plugin))
        copied = get_plain(self.dest.data(), ("plugins", self.plugin))
        if not isinstance(main, dict) or not isinstance(copied, dict):
            return
        stale = cri_drift(main, copied, whole_section=self.version < 3)
        for key, value, _ in stale:
            self.dest.set(self._key(*key), copy.deepcopy(value))
        if stale:
            self.notes.append(f"{self.drop_in}: brought {len(stale)} CRI setting(s) of its copy up to date with "
                              f"{self.config_path} ({', '.join('.'.join(k) for k, _, _ in stale[:3])}"
                              f"{', ...' if len(stale) > 3 else ''})")

    def _copied_options(self) -> dict:
        runtimes = get_table(self.source, ("plugins", self.source_plugin, "containerd", "runtimes"),
                             "containerd config source")
        for name in self.low_level_runtimes():
            if isinstance(runtimes.get(name), dict):
                return copy.deepcopy(runtimes[name])
        note = (f"no {', '.join(self.low_level_runtimes())} runtime to copy options from: "
                f"using runtime_type {self.options.runtime_type!r}")
        if note not in self.notes:  # once, not once per runtime added (nvidia, nvidia-cdi, nvidia-legacy)
            self.notes.append(note)
        return {"runtime_type": self.options.runtime_type, "runtime_root": "", "runtime_engine": "",
                "privileged_without_host_devices": False}

    # --- imports (drop-in mode) ---
    def _import_pattern(self) -> str:
        seen_as = self.options.drop_in_host_path or self.drop_in
        assert seen_as is not None  # drop-in mode
        return os.path.join(os.path.dirname(seen_as), "*.toml")

    def _imports(self) -> list:
        imports = self.main.get(("imports",))
        if imports is MISSING:
            return []
        if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
            raise ConfigError(f"{self.config_path}: imports is not a list of strings")
        return imports

    def _add_import(self) -> None:
        seen_as = self.options.drop_in_host_path or self.drop_in
        imports = self._imports()
        if any(fnmatch.fnmatch(seen_as, pattern) for pattern in imports):
            return
        if not self.main.data():
            self.main.set(("version",), self.version)
        self.main.set(("imports",), imports + [self._import_pattern()])

    def _remove_import(self) -> None:
        pattern = self._import_pattern()
        imports = self._imports()
        if pattern not in imports:
            return
        drop_in = self.drop_in
        assert drop_in is not None  # drop-in mode
        others = [p for p in glob.glob(os.path.join(os.path.dirname(drop_in), "*.toml"))
                  if os.path.abspath(p) != os.path.abspath(drop_in)]
        if others:
            self.notes.append(f"kept {pattern!r} in {self.config_path} imports: other files use it")
            return
        rest = [p for p in imports if p != pattern]
        if rest:
            self.main.set(("imports",), rest)
        else:
            self.main.delete(("imports",))

    @staticmethod
    def _drop_lone_version(doc: Document) -> None:
        if doc.edits and list(doc.data()) == ["version"]:
            doc.delete(("version",))

    # --- reading ---
    def default_runtime(self) -> str | None:
        value = get_plain(self.source, ("plugins", self.source_plugin, "containerd", "default_runtime_name"))
        return value if isinstance(value, str) else None

    def runtime_binary(self, name: str) -> str | None:
        entry = get_plain(self.source, ("plugins", self.source_plugin, "containerd", "runtimes", name))
        if not isinstance(entry, dict):
            return None
        options = entry.get("options")
        options = options if isinstance(options, dict) else {}
        path = options.get("BinaryName") or options.get("Runtime")
        return path if isinstance(path, str) else None

    @classmethod
    def command_source(cls, executable: str | None, config_path: str) -> list[list[str]]:
        argv = [executable or "containerd"]
        if os.path.exists(config_path):
            argv += ["--config", config_path]
        return [argv + ["config", "dump"]]


def cri_drift(main: dict, drop_in: dict, *, whole_section: bool) -> list[tuple[tuple, Any, Any]]:
    """Settings of the main file's CRI section that a drop-in's section overrides: (key, main's, drop-in's).

    A key the drop-in sets to another value always wins over the main file's;
    with ``whole_section`` (containerd 1.x) one it lacks is lost as well
    (the drop-in's value is then MISSING). The drop-in's NVIDIA runtimes, an
    NVIDIA default runtime (``--set-as-default``) and ``enable_cdi = true`` are
    what it is for, not drift; another default runtime is only a copy.
    """
    out: list[tuple[tuple, Any, Any]] = []
    for key, value in _leaves(main, ()):
        if key[:2] == ("containerd", "runtimes") and len(key) > 2 and key[2].startswith("nvidia"):
            continue
        theirs = get_plain(drop_in, key)
        if key == ("containerd", "default_runtime_name") and isinstance(theirs, str) and theirs.startswith("nvidia"):
            continue
        if key == ("enable_cdi",) and theirs is True:
            continue
        if theirs is MISSING and not whole_section:
            continue
        if theirs != value:
            out.append((key, value, theirs))
    return out


def _leaves(table: dict, prefix: tuple):
    for key, value in table.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, prefix + (key,))
        else:
            yield prefix + (key,), value
