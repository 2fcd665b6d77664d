#!/usr/bin/env bash
# Builds nvct-<version>-1.noarch.rpm with packaging/rpm/nvct.spec from a
# tarball of this tree (its Source0), in a private rpmbuild top directory,
# and copies the .rpm to OUTDIR.
#
#   scripts/build-rpm.sh [OUTDIR]      (default: dist/)
#
# RPM_DIST, when set, is the release's %{dist} suffix (e.g. ".upgrade1": a
# later release of the same version, as the tests' upgrade needs).
#
# Needs: rpm (rpmbuild), python3-build, python3-installer, python3-setuptools,
# python3-wheel. On a host whose rpm database does not know the build
# dependencies (Debian), they are not checked (--nodeps).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$top/dist}" && cd "${1:-$top/dist}" && pwd)
. "$top/packaging/lib.sh"

spec="$top/packaging/rpm/nvct.spec"
version=$(project_version "$top")
spec_version=$(sed -n 's/^Version: *//p' "$spec")
if [ "$spec_version" != "$version" ]; then
    echo "build-rpm: packaging/rpm/nvct.spec is at $spec_version but pyproject.toml at $version" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"/{BUILD,BUILDROOT,RPMS,SOURCES,SPECS,SRPMS}
copy_source_tree "$top" "$work/src/nvct-$version"
tar -C "$work/src" -czf "$work/SOURCES/nvct-$version.tar.gz" "nvct-$version"
cp "$spec" "$work/SPECS/"

nodeps=()
rpm -q --whatprovides python3-devel >/dev/null 2>&1 || nodeps=(--nodeps)
dist=()
[ -n "${RPM_DIST:-}" ] && dist=(--define "dist $RPM_DIST")
rpmbuild -bb "${nodeps[@]}" "${dist[@]}" --define "_topdir $work" "$work/SPECS/nvct.spec" \
    >"$work/build.log" 2>&1 || {
    tail -n 40 "$work/build.log" >&2
    echo "build-rpm: rpmbuild failed (last lines above)" >&2
    exit 1
}
rpm=$(find "$work/RPMS" -name "nvct-$version-*.noarch.rpm")
cp "$rpm" "$out/"
echo "$out/$(basename "$rpm")"
