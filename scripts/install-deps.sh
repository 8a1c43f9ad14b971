#!/usr/bin/env bash
# Install the Debian packages poprun-py's tests need (sshd, Open MPI, iproute2, Slurm, ...).
#
# Idempotent and fast: every package is checked by one program it provides (the table in
# tests/requirements.py, which the tests' skips use too), and apt is not touched at all when
# nothing is missing. As root, missing packages are installed with one `apt-get update` and one
# `apt-get install`, without starting their services. As another user it only reports what is
# missing, in one line, and exits 0. Python packages are not handled here.
#
# Usage: scripts/install-deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

# The Debian packages the tests need, from their one table (tests/requirements.py: a program
# each package provides; present means installed), by the distribution's python3 (stdlib only).
missing_packages() {
    local packages
    packages=$(python3 tests/requirements.py --packages | tr '\n' ' ')
    read -r -a missing <<<"$packages"
}

if ! command -v python3 >/dev/null 2>&1; then
    echo "install-deps: needs python3 (Debian: apt-get install python3 python3-venv)" >&2
    exit 1
fi
missing_packages

if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: not root; missing Debian packages: ${missing[*]}; as root run: apt-get install ${missing[*]} (until then, the tests that need them skip, naming what they need)" >&2
    exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2

# Keep package maintainer scripts from starting sshd, slurmd, munged, ... (Debian's policy-rc.d).
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
apt_options=(-o DPkg::Lock::Timeout=120 -q)
apt-get "${apt_options[@]}" update
apt-get "${apt_options[@]}" install -y --no-install-recommends "${missing[@]}"

missing_packages
if [ "${#missing[@]}" -ne 0 ]; then
    echo "install-deps: still missing after apt-get: ${missing[*]}" >&2
    exit 1
fi
