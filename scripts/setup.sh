#!/usr/bin/env bash
# Installs everything nvct's demo and tests need on a fresh Debian 12 machine (as root),
# then makes .venv: Debian's /usr/bin/python3 with the system's python3-* packages,
# and nvct installed into it in editable mode. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  gcc gcc-multilib libc6-dev libcap-dev make
  python3 python3-venv python3-pip python3-setuptools python3-dev
  python3-click python3-tomlkit python3-prctl python3-yaml
  python3-pytest python3-pyfakefs python3-hypothesis
  python3-pyelftools  # tests only: an independent check of nvct.linux.elf (docs/packaging.md)
  runc crun busybox-static strace patchelf  # strace, patchelf: the host-without-Python test
  docker.io containerd podman conmon catatonit containernetworking-plugins
  python3-grpcio python3-protobuf
  build-essential dpkg-dev debhelper dh-python python3-all pybuild-plugin-pyproject lintian
  rpm python3-build python3-installer python3-wheel
  iproute2 util-linux
  systemd  # the nvidia-cdi-refresh units: systemd-analyze verify, and systemd as PID 1 in a runc container
  mmdebstrap  # tests/support/noderoot.py: a root with today's engines (containerd 2.x, docker 28)
  # aarch64 nodes (nvct simulate node --arch aarch64, tests/e2e/test_aarch64.py): clang and the arm64
  # cross sysroot compile the node's ELF files (Debian's gcc cross compilers conflict with gcc-multilib);
  # qemu-user-static runs arm64 programs through binfmt_misc.
  clang libc6-dev-arm64-cross libgcc-12-dev-arm64-cross binutils-aarch64-linux-gnu qemu-user-static
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

# Debian's arm64 libc6, libc-bin (its ldconfig) and busybox-static for the arm64 test image and node,
# downloaded once through a private apt state: the host's dpkg architectures stay as they are.
ARM64_DEBS=build/arm64-debs
if ! ls "$ARM64_DEBS"/libc6_*_arm64.deb "$ARM64_DEBS"/libc-bin_*_arm64.deb \
        "$ARM64_DEBS"/busybox-static_*_arm64.deb >/dev/null 2>&1; then
  echo "setup: downloading Debian's arm64 libc6 libc-bin busybox-static into $ARM64_DEBS"
  state=$(mktemp -d)
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$ARM64_DEBS"
  apt_arm64=(-o APT::Architecture=arm64 -o APT::Architectures::=arm64 -o "Dir::State::Lists=$state/lists"
             -o "Dir::Cache=$state/cache" -o Dir::State::status=/dev/null -o APT::Sandbox::User=root)
  apt-get "${apt_arm64[@]}" update -qq
  (cd "$ARM64_DEBS" && apt-get "${apt_arm64[@]}" -qq download libc6 libc-bin busybox-static)
  rm -rf "$state"
fi

# Always Debian's interpreter: a pyenv python3 may come first on PATH.
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
# Editable install (the programs in nvct/scripts are copied, so a newer one means reinstall);
# the import is checked from / so the checkout's cwd does not count.
stale=
for f in nvct/scripts/*; do  # the programs: links to nvct/scripts/launcher, which -nt follows
  [ "$f" = nvct/scripts/launcher ] && continue
  [ -x ".venv/bin/${f##*/}" ] && [ ! "$f" -nt ".venv/bin/${f##*/}" ] || stale=1
done
if [ -n "$stale" ] || ! (cd / && "$OLDPWD/.venv/bin/python" -c "import nvct, sys; sys.exit(nvct.__file__ != \"$PWD/nvct/__init__.py\")") 2>/dev/null; then
  # compat mode: a .pth path entry, which wins over an installed nvct deb in dist-packages.
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation --config-settings editable_mode=compat -e . >/dev/null
fi

# The linter and type checker .ci/run runs before the tests (docs/contributing.md), pinned, from PyPI:
# Debian 12's ruff and mypy are too old for pyproject.toml's settings.
LINT_TOOLS=(ruff==0.17.6 mypy==2.4.1)
for t in "${LINT_TOOLS[@]}"; do
  [ "$(.venv/bin/python -m pip show "${t%%==*}" 2>/dev/null | sed -n 's/^Version: //p')" = "${t##*==}" ] || {
    echo "setup: installing ${LINT_TOOLS[*]} into .venv"
    .venv/bin/python -m pip install -q "${LINT_TOOLS[@]}"
    break
  }
done
