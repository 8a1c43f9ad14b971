# shellcheck shell=bash
# The project's own virtual environment, for scripts/example.sh and scripts/test.sh (sourced).
#
# Debian 12 and Ubuntu 23.04+ refuse `pip install` into the distribution's Python (PEP 668,
# externally-managed-environment), so poprun-py is installed into `.venv/` in the checkout
# (ignored by git), created once and reused:
#
#   - `.venv` is created with "$PYTHON" (default: python3) when it is missing, broken, or was
#     made from another interpreter than an explicitly set PYTHON. `python3 -m venv` needs
#     Debian's/Ubuntu's python3-venv: as root it is installed with apt-get, otherwise one line
#     says what to install.
#   - poprun-py is installed into it editable, in compat mode (a plain path entry: no import
#     hook at each start), with the extras asked for. A stamp records what was installed for
#     which pyproject.toml; when nothing changed, pip is not run at all.
#   - afterwards `.venv/bin` is first on PATH (and VIRTUAL_ENV set), so `python`, `python3` and
#     `poprun-py` are the venv's, also for processes started from it (test hosts' sshd
#     sessions inherit that PATH).
#
# Usage (from the checkout's root):  . scripts/venv.sh; venv_ready ""   # or "test"
# Then: "$VENV_PYTHON" ...

VENV_DIR="$PWD/.venv"
VENV_PYTHON="$VENV_DIR/bin/python"
VENV_STAMPS="$VENV_DIR/.poprun-py"

venv_log() {
    echo "venv: $*" >&2
}

# The interpreter (real path) and version of "$1", as one line; fails when it does not run.
venv_identity() {
    "$1" -c 'import os, sys; print(os.path.realpath(sys.executable), sys.version.split()[0])' 2>/dev/null
}

# What the installed state must match: pyproject.toml, the checkout's path, the venv's Python
# (VENV_IDENTITY, set by venv_create).
venv_key() {
    {
        cat pyproject.toml
        echo "$PWD"
        echo "$VENV_IDENTITY"
    } | sha256sum | cut -d' ' -f1
}

# Make sure "$PYTHON" can create a venv (ensurepip present); install python3-venv as root.
venv_need_ensurepip() {
    local python=$1 version package
    if "$python" -c 'import ensurepip, venv' 2>/dev/null; then
        return 0
    fi
    version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    # Debian/Ubuntu split venv support out: python3-venv for the default python3, else pythonX.Y-venv
    if [ "$(venv_identity python3 2>/dev/null | cut -d' ' -f2 | cut -d. -f1-2)" = "$version" ]; then
        package=python3-venv
    else
        package="python${version}-venv"
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        venv_log "cannot create .venv: $python has no ensurepip; install $package first (as root: apt-get install $package)"
        return 1
    fi
    venv_log "installing $package (python3 -m venv needs it)"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 -q update >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 -q install -y \
        --no-install-recommends "$package" >&2
    "$python" -c 'import ensurepip, venv'
}

# Create .venv when missing, broken, or not made from an explicitly set PYTHON.
venv_create() {
    local python=${PYTHON:-python3} want have
    have=$(venv_identity "$VENV_PYTHON" || true)
    VENV_IDENTITY=$have
    if [ -n "$have" ] && [ -z "${PYTHON:-}" ]; then
        return 0  # any working venv will do
    fi
    if ! want=$(venv_identity "$python"); then
        venv_log "cannot create .venv: PYTHON=$python does not run (Debian/Ubuntu: apt-get install python3 python3-venv)"
        return 1
    fi
    if [ -n "$have" ]; then
        [ "$have" = "$want" ] && return 0
        venv_log "recreating .venv: it runs $have, PYTHON=$PYTHON is $want"
    elif [ -e "$VENV_DIR" ]; then
        venv_log "recreating .venv: $VENV_PYTHON does not run"
    fi
    if [ -e "$VENV_DIR" ] && [ ! -e "$VENV_DIR/pyvenv.cfg" ]; then
        venv_log "$VENV_DIR exists but is not a virtual environment; move it away"
        return 1
    fi
    venv_need_ensurepip "$python"
    venv_log "creating .venv with $(venv_identity "$python")"
    "$python" -m venv --clear "$VENV_DIR"
    VENV_IDENTITY=$(venv_identity "$VENV_PYTHON")
}

# venv_ready EXTRA: .venv exists with poprun-py (and EXTRA: "" or "test") installed from this
# checkout; .venv/bin first on PATH.
venv_ready() {
    local extra=$1 key spec
    venv_create
    key=$(venv_key)
    if [ "$(cat "$VENV_STAMPS/test" 2>/dev/null)" != "$key" ] &&
        { [ -n "$extra" ] || [ "$(cat "$VENV_STAMPS/base" 2>/dev/null)" != "$key" ]; }; then
        spec=.
        [ -n "$extra" ] && spec=".[$extra]"
        venv_log "installing poprun-py ($spec, editable) into .venv"
        rm -rf "$VENV_STAMPS"
        # editable as a plain path entry (compat): no import hook runs at each start (~15 ms)
        "$VENV_PYTHON" -m pip install --quiet --disable-pip-version-check \
            --config-settings editable_mode=compat -e "$spec"
        mkdir -p "$VENV_STAMPS"
        echo "$key" >"$VENV_STAMPS/${extra:-base}"
    fi
    export VIRTUAL_ENV="$VENV_DIR"
    export PATH="$VENV_DIR/bin:$PATH"
}
