#!/usr/bin/env bash
# Install the Debian packages poprun-py's tests need (sshd, Open MPI, iproute2, Slurm, ...).
#
# Idempotent and fast: every package is checked by one binary (or header) it provides, and apt
# is not touched at all when nothing is missing. As root, missing packages are installed with
# one `apt-get update` and one `apt-get install`, without starting their services. As another
# user it only reports what is missing and exits 0. Python packages are not handled here.
#
# Usage: scripts/install-deps.sh
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

# package:command  (a command the package provides; present means installed)
REQUIREMENTS=(
    openssh-server:sshd
    openssh-client:ssh
    openmpi-bin:mpirun
    libopenmpi-dev:mpicc
    mpich:mpiexec.hydra
    libmpich-dev:mpicc.mpich
    iproute2:ip
    numactl:numactl
    rsync:rsync
    pdsh:pdsh
    clustershell:clush
    procps:pkill
    psmisc:killall
    iputils-ping:ping
    netcat-openbsd:nc
    slurmctld:slurmctld
    slurmd:slurmd
    slurm-client:srun
    munge:munged
)

present() {
    command -v "$1" >/dev/null 2>&1
}

missing=()
for requirement in "${REQUIREMENTS[@]}"; do
    package="${requirement%%:*}"
    check="${requirement#*:}"
    present "$check" || missing+=("$package")
done

if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: not root; missing Debian packages: ${missing[*]}" >&2
    echo "install-deps: as root run: apt-get install ${missing[*]} (until then, the tests that use them fail or skip)" >&2
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

still_missing=()
for requirement in "${REQUIREMENTS[@]}"; do
    present "${requirement#*:}" || still_missing+=("${requirement%%:*}")
done
if [ "${#still_missing[@]}" -ne 0 ]; then
    echo "install-deps: still missing after apt-get: ${still_missing[*]}" >&2
    exit 1
fi
