#!/usr/bin/env bash
# Installs everything nvct's demo and tests need on a fresh Debian 12 machine (as root),
# then makes .venv: Debian's /usr/bin/python3 with the system's python3-* packages,
# and nvct installed into it in editable mode. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  gcc gcc-multilib libc6-dev libcap-dev make
  python3 python3-venv python3-pip python3-setuptools python3-dev
  python3-click python3-tomlkit python3-pyelftools python3-prctl python3-yaml
  python3-pytest python3-pyfakefs python3-hypothesis
  runc crun busybox-static strace patchelf  # strace, patchelf: the host-without-Python test
  docker.io containerd podman conmon catatonit containernetworking-plugins
  python3-grpcio python3-protobuf
  build-essential dpkg-dev debhelper dh-python python3-all pybuild-plugin-pyproject lintian
  rpm python3-build python3-installer python3-wheel
  iproute2 util-linux
  systemd  # systemd-analyze verify: the nvidia-cdi-refresh units
  mmdebstrap  # tests/support/noderoot.py: a root with today's engines (containerd 2.x, docker 28)
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  # No systemd here: keep maintainer scripts from starting daemons.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
fi

# Always Debian's interpreter: a pyenv python3 may come first on PATH.
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
# Editable install (the programs in nvct/scripts are copied, so a newer one means reinstall);
# the import is checked from / so the checkout's cwd does not count.
stale=
for f in nvct/scripts/*; do
  [ -x ".venv/bin/${f##*/}" ] && [ ! "$f" -nt ".venv/bin/${f##*/}" ] || stale=1
done
if [ -n "$stale" ] || ! (cd / && "$OLDPWD/.venv/bin/python" -c "import nvct, sys; sys.exit(nvct.__file__ != \"$PWD/nvct/__init__.py\")") 2>/dev/null; then
  # compat mode: a .pth path entry, which wins over an installed nvct deb in dist-packages.
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation --config-settings editable_mode=compat -e . >/dev/null
fi
