# Shared by scripts/build-deb.sh and scripts/build-rpm.sh (sourced, not run).

# Debian's tools and interpreter only: a pyenv or virtualenv python3 that comes
# first on PATH must not build the package or end up in its shebangs.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
unset VIRTUAL_ENV PYTHONPATH PYTHONHOME PYENV_VERSION PYTHONUSERBASE

# project_version TOP: the version in TOP/pyproject.toml.
project_version() {
    sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$1/pyproject.toml" | head -n 1
}

# copy_source_tree TOP DEST: the working tree as it is (committed or not),
# without what .gitignore ignores (virtualenvs, caches, dist/, build/).
copy_source_tree() {
    mkdir -p "$2"
    if git -C "$1" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        (cd "$1" && git ls-files -z --cached --others --exclude-standard |
            xargs -0 -r sh -c 'for f; do [ -e "$f" ] || [ -L "$f" ] && printf "%s\0" "$f"; done' sh |
            tar --null --no-recursion -T - -cf -) | tar -C "$2" -xf -
    else
        tar -C "$1" --exclude=.git --exclude=.venv --exclude=dist --exclude=build \
            --exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache \
            --exclude=.hypothesis -cf - . | tar -C "$2" -xf -
    fi
}
