#!/usr/bin/env bash
# Builds nvct_<version>_all.deb from a clean copy of this tree, with
# packaging/debian as its debian/ directory, and copies the .deb, .changes
# and .buildinfo to OUTDIR.
#
#   scripts/build-deb.sh [OUTDIR]      (default: dist/)
#
# Needs: dpkg-dev debhelper dh-python python3-all pybuild-plugin-pyproject.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$top/dist}" && cd "${1:-$top/dist}" && pwd)
. "$top/packaging/lib.sh"

version=$(project_version "$top")
deb_version=$(dpkg-parsechangelog -l "$top/packaging/debian/changelog" -S Version)
if [ "$deb_version" != "$version" ]; then
    echo "build-deb: packaging/debian/changelog is at $deb_version but pyproject.toml at $version" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src="$work/nvct-$version"
copy_source_tree "$top" "$src"
rm -rf "$src/debian"
cp -a "$top/packaging/debian" "$src/debian"

(cd "$src" && dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 || {
    tail -n 40 "$work/build.log" >&2
    echo "build-deb: dpkg-buildpackage failed (last lines above)" >&2
    exit 1
}
for f in "$work"/nvct_"$version"_*; do
    cp "$f" "$out/"
done
echo "$out/nvct_${version}_all.deb"
