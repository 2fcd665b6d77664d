"""The ldconfig step never imports from inside the container root (red-team finding).

On a node set up by ``nvct toolkit install`` whose python3 cannot load
python-prctl (not the Python it was built for), ``import prctl`` fails before
the chroot, and Python does not remember a failed import: a second one inside
the root found the image's ``prctl.py`` at the toolkit's own ``lib/python``
path and ran it as root with full capabilities. Here the host's failing import
is a ``prctl.py`` in the installed copy that raises ImportError, the image
ships one at the same path that leaves a marker, and a GPU container runs
through the toolkit's runtime wrapper under runc in jit-cdi mode.
"""

from __future__ import annotations

import os
import sys

import pytest

from nvct.toolkit import Installation, Options
from tests.support.bundle import make_bundle
from tests.support.gpu_runs import PATH_ENV, mounts_under, need_runtime
from tests.support.rootfs import make_rootfs
from tests.support.runtimes import RUNC, run_container

pytestmark = pytest.mark.containers

IMAGE_PRCTL = """
import os
with open("/prctl-ran", "w") as f:
    f.write("uid %d\\n" % os.getuid())
raise ImportError("the image's prctl")
"""


def test_an_image_prctl_py_never_runs_in_the_ldconfig_step(tmp_path, sim_node):
    need_runtime("runc")
    roots = sim_node["roots"]
    opts = Options(install_dir=str(tmp_path / "install"), host_root="/", no_runtime_config=True,
                   python=sys.executable, driver_root=roots["driver_root"], dev_root=roots["dev_root"],
                   proc_root=roots["proc_root"], low_level_runtimes=[RUNC], runtime_mode="jit-cdi")
    Installation(opts, lambda *_: None).install()
    toolkit = tmp_path / "install" / "toolkit"
    [python_dir] = [d for d, subdirs, _ in os.walk(toolkit) if "nvct" in subdirs and d.endswith("/python")]
    with open(os.path.join(python_dir, "prctl.py"), "w") as f:  # the host Python cannot load it
        f.write('raise ImportError("built for another Python")\n')

    rootfs = make_rootfs(tmp_path)
    planted = os.path.join(rootfs, python_dir.lstrip("/"), "prctl.py")
    os.makedirs(os.path.dirname(planted))
    with open(planted, "w") as f:
        f.write(IMAGE_PRCTL)
    bundle = make_bundle(tmp_path / "bundle", rootfs,
                         ["sh", "-c", "test -c /dev/nvidia0 && dlopen-probe libcuda.so.1 >/dev/null && echo gpu-ok"],
                         [PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"])
    result = run_container([str(toolkit / "nvidia-container-runtime")], bundle,
                           env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                           log_file=str(tmp_path / "log.json"), timeout=60)
    assert not os.path.exists(os.path.join(rootfs, "prctl-ran")), "the image's prctl.py ran in the ldconfig step"
    assert result.rc == 0 and "gpu-ok" in result.stdout, result.describe()
    assert not mounts_under(str(tmp_path))
