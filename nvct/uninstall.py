"""What removing the nvct package does to the node: undo what nvct configured, name what is left.

Run by the package's removal script (deb ``prerm remove``, rpm ``%preun``) while
nvct's programs are still there, as ``python3 -I -m nvct.uninstall``:

* every engine config ``nvct runtime configure`` changed (docker, containerd,
  cri-o, the OCI hook file; :mod:`nvct.runtimes.configured`) is unconfigured
  from its undo record, so no engine keeps a runtime that runs a removed program
  (what a running ``nvct toolkit install`` changed stays: it runs its own copy);
* CDI specs under ``/var/run/cdi`` whose hooks run nvct's programs (what the
  package's ``nvidia-cdi-refresh`` unit generates) are removed;
* anything else that still names nvct's programs (a runtime entry nvct did not
  write, a spec in ``/etc/cdi``) is listed with what to do about it.

``--in-favour PACKAGE`` (the NVIDIA Container Toolkit replacing nvct, whose
programs have the same names) changes nothing. Never fails: a removal must not
stop half-way; what could not be undone is said.
"""

from __future__ import annotations

import glob
import os
import sys

#: Programs the package installs that other configs name.
PROGRAMS = ("/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime-hook", "/usr/bin/nvct",
            "/usr/bin/nvidia-cdi-hook", "/usr/bin/nvidia-ctk")
_RESTART = {"docker": "restart dockerd", "containerd": "restart containerd", "crio": "restart cri-o"}
#: Engine configs checked for entries nvct did not write (the reference's, or hand-made).
ENGINE_FILES = ("/etc/docker/daemon.json", "/etc/containerd/config.toml", "/etc/containerd/conf.d/*.toml",
                "/etc/crio/crio.conf", "/etc/crio/crio.conf.d/*", "/usr/share/containers/oci/hooks.d/*.json",
                "/etc/containers/oci/hooks.d/*.json")
GENERATED_SPECS = "/var/run/cdi"
SPEC_DIRS = ("/etc/cdi",)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--in-favour"]:
        replacement = argv[1] if len(argv) > 1 else "another package"
        _say(f"replaced by {replacement}, which provides the same programs: engine configs and CDI specs "
             "are left as they are")
        return 0
    for line in undo_configured() + remove_generated_specs() + leftovers():
        _say(line)
    return 0


def undo_configured() -> list[str]:
    """Unconfigure every config nvct configured; one line per config."""
    from nvct import runtimes
    from nvct.errors import NvctError
    from nvct.runtimes import configured

    lines = []
    for engine, path in configured.entries():
        if not os.path.exists(runtimes.record_path(path)):
            configured.remove(path)  # unconfigured by other means
            continue
        try:
            if engine == "oci-hook":
                change = runtimes.unconfigure_hook(path)
            else:
                change = runtimes.unconfigure(engine, path)
        except NvctError as e:
            lines.append(f"could not undo the {engine} configuration in {path}: {e}; "
                         f"remove its NVIDIA runtime by hand")
            continue
        if change.keep_record:  # only an installer's changes (its own SIGTERM undoes them)
            continue
        lines += [f"{path}: {note}" if not note.startswith(path) else note for note in change.notes]
        restart = f" ({_RESTART[engine]} to apply)" if engine in _RESTART else ""
        lines.append(f"undid its configuration of {engine} in {path}{restart}")
    return lines


def remove_generated_specs() -> list[str]:
    """CDI specs in the runtime spec dir whose hooks run nvct's programs."""
    lines = []
    for path in sorted(glob.glob(os.path.join(GENERATED_SPECS, "*"))):
        if os.path.isfile(path) and _names_our_program(path):
            try:
                os.unlink(path)
            except OSError as e:
                lines.append(f"could not remove {path}: {e.strerror}")
                continue
            lines.append(f"removed {path} (a CDI spec whose hooks run nvct's programs)")
    return lines


def leftovers() -> list[str]:
    """Files outside nvct's undo records that still name its programs."""
    lines = []
    for pattern in ENGINE_FILES:
        for path in sorted(glob.glob(pattern)):
            program = _names_our_program(path)
            if program:
                lines.append(f"{path} still names {program}, which is removed with nvct: remove that entry "
                             "(or install the NVIDIA Container Toolkit, which provides it), then restart the engine")
    for directory in SPEC_DIRS:
        for path in sorted(glob.glob(os.path.join(directory, "*"))):
            program = _names_our_program(path)
            if program:
                lines.append(f"{path} is a CDI spec whose hooks run {program}, which is removed with nvct: "
                             f"delete it, or regenerate it with the toolkit that replaces nvct")
    return lines


def _names_our_program(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return None
    for program in PROGRAMS:
        if program in text:
            return program
    if '"nvidia-container-runtime"' in text:  # docker's bare runtime path, as configure writes it
        return "nvidia-container-runtime"
    return None


def _say(line: str) -> None:
    sys.stdout.write(f"nvct: {line}\n")


if __name__ == "__main__":
    sys.exit(main())
