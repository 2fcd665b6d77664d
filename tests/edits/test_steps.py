"""nvct.edits.steps: the chain's steps as values, their one writer and their one parser."""

from __future__ import annotations

import pytest

from nvct.edits import steps as kinds
from nvct.edits.model import Chain, ContainerEdits, Hook, as_chain

ALL = [
    kinds.CreateSymlinks((("libcuda.so.1", "/usr/lib/libcuda.so"), ("../a.so.1", "/usr/lib/gbm/b.so"))),
    kinds.EnableCudaCompat("575.57.08"),
    kinds.EnableCudaCompat("575.57.08", "12.9", "/opt/compat", ("2", "5")),
    kinds.EnableCudaCompat("550.54.15", gpu_uuids=("GPU-1", "GPU-2"), driver_root="/run/nvidia/driver"),
    kinds.UpdateLdcache(("/usr/lib", "/usr/lib32"), ("/usr/lib/libcuda.so.1",), "@/sbin/ldconfig.real"),
    kinds.CreateSonameSymlinks(("/usr/lib",)),
    kinds.MaskParams(),
    kinds.MaskParams("update-nvidia-params"),
    kinds.Chmod("755", ("/dev/dri",)),
    kinds.UpdateApplicationProfile(),
    kinds.BindMount("/run/mps", "/tmp/nvidia-mps", ("nosuid", "nodev", "rbind")),
    kinds.ReadonlyRoot(),
    kinds.ApplyCudaMemoryLimits("/", ("GPU-1", "GPU-2")),
    kinds.CheckRequirements("575.57.08", "12.9", (("/dev/nvidia0", "9.0", "2"),)),
    kinds.Unknown("from-a-newer-nvct", ("--x", "y")),
]


def test_every_step_is_read_back_as_it_was_written():
    assert kinds.parse(kinds.to_argv(ALL)) == ALL
    assert {type(s) for s in ALL} == set(kinds.Step.__subclasses__())  # every kind


def test_the_reference_forms_are_read():
    """NVIDIA's specs: ``--flag=value``, flags repeated, a flag without value."""
    assert kinds.parse(["create-symlinks", "--link=a::/b", "--link", "c::/d", "--", "update-ldcache",
                        "--folder=/usr/lib"]) == [kinds.CreateSymlinks((("a", "/b"), ("c", "/d"))),
                                                  kinds.UpdateLdcache(("/usr/lib",), ())]


@pytest.mark.parametrize("argv, error", [
    (["create-symlinks", "--link", "no-separator"], "create-symlinks: invalid --link 'no-separator'"),
    (["chmod", "--mode", "9z", "--path", "/x"], "chmod: invalid --mode '9z'"),
    (["update-ldcache", "stray"], "update-ldcache: unexpected argument 'stray'"),
])
def test_wrong_flags_are_kept_as_written_for_the_hook_to_report(argv, error):
    [step] = kinds.parse(argv)
    assert isinstance(step, kinds.Invalid) and step.error.startswith(error)
    assert kinds.to_argv([step]) == argv


def test_a_chain_becomes_arguments_only_when_written_and_comes_back_the_same():
    chain = Chain("createContainer", "/usr/bin/nvidia-cdi-hook", ("nvidia-cdi-hook", "chain"),
                  (kinds.MaskParams(),), "/run/root", (64768, 1234))
    assert chain.args == ("nvidia-cdi-hook", "chain", "--container-root", "/run/root", "--root-identity",
                          "64768:1234", "disable-device-node-modification")
    hook = Hook("createContainer", chain.path, chain.args)
    assert as_chain(hook) == chain
    assert ContainerEdits.from_cdi(ContainerEdits(hooks=[chain]).to_cdi()).hooks == [chain]
    assert chain.replace(args=("nvct", "hook", "chain", "chmod", "--mode", "755", "--path", "/x")).steps == (
        kinds.Chmod("755", ("/x",)),)


def test_other_hooks_are_no_chain():
    assert as_chain(Hook("createContainer", "/usr/bin/nvidia-cdi-hook", ("nvidia-cdi-hook", "update-ldcache"))) is None
    plain = Chain("createContainer", "/x", ("nvct", "hook", "chain"), ()).replace(args=("x", "y"))
    assert type(plain) is Hook and plain.args == ("x", "y")
