#!/usr/bin/env bash
# The README's two commands on a bare Debian 12, as a new user would run them.
#
# Builds (once, cached) a bare Debian 12 root with debootstrap: minbase plus python3,
# python3-pip, python3-venv, git and ca-certificates (Debian's own, externally managed Python;
# no numactl, no mpirun, no ssh). Each run copies that pristine root, clones this checkout's
# HEAD into it (committed work only: uncommitted changes are not in the check), and runs
# inside it with chroot:
#
#   as an ordinary user (its own clone in its home), first, as on a fresh machine:
#                       scripts/example.sh (first run: creates .venv, installs),
#                       scripts/example.sh again (must not run pip),
#                       scripts/test.sh    (must pass: tests needing root or a missing package
#                                           skip, naming it: tests/requirements.py);
#   as root:            scripts/example.sh,
#                       scripts/test.sh    (installs the Debian packages, the whole suite);
#
# and prints the wall time and exit code of each (for test.sh also pytest's counts), then the
# total. Exit code: 0 when every step succeeded, else 1. CI is passed to root's steps only
# (CI=true makes every skip a failure, and an ordinary user's run skips what needs root).
#
# The chroot gets what the tests need of a real machine: its root is a mount point (a bind
# mount of itself: `ip netns exec` runs `mount --make-rslave /`), proc, sys (with its cgroup
# mounts: slurmd needs them), dev, dev/pts, dev/shm, a tmpfs on /run, the host's resolv.conf,
# an /etc/hosts as an installed machine has (debootstrap writes none), and the host's CA
# bundle (this workplace inspects TLS: the package registries answer only with the host's CA)
# for pip (/etc/pip.conf `cert =`) and apt (Acquire::https::CAInfo). The commands run with a
# clean environment (env -i), so nothing of the host's Python set-up leaks in; CI is passed
# through when set. Test hosts made inside share this machine's network stack: the chroot
# takes the host's test-host lock, so subnets are not picked twice. Everything is unmounted on
# exit, also on failure or Ctrl-C; processes left inside the root are stopped first.
#
# Needs root. Network: only the Debian mirror (apt, debootstrap) and PyPI (pip).
# Ubuntu 24.04 cannot be built here (no Ubuntu mirror is reachable); the scripts under test
# use the same mechanism there (PEP 668, python3-venv).
#
# Usage: scripts/bare-check.sh [--keep] [--refresh] [--quick] [--example-args 'ARGS']
#   --keep          keep the work root (printed) instead of deleting it
#   --refresh       rebuild the cached pristine root (/var/cache/poprun-py/bare-check)
#   --quick         only the example.sh runs (no test.sh)
#   --example-args  extra poprun-py launch options for every example.sh run
set -euo pipefail

SUITE=bookworm
MIRROR=http://deb.debian.org/debian
INCLUDE=python3,python3-pip,python3-venv,git,ca-certificates
CACHE=/var/cache/poprun-py/bare-check
PRISTINE="$CACHE/$SUITE"
HOST_CA=/etc/ssl/certs/ca-certificates.crt
HOST_LOCK_DIR=/var/lib/poprun-py/testhosts
USER_NAME=bare
CHROOT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

keep=false
refresh=false
quick=false
example_args=""
while [ $# -gt 0 ]; do
    case "$1" in
        --keep) keep=true ;;
        --refresh) refresh=true ;;
        --quick) quick=true ;;
        --example-args) example_args=${2?--example-args needs a value}; shift ;;
        --example-args=*) example_args=${1#*=} ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bare-check: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

log() {
    echo "bare-check: $*" >&2
}

elapsed() {  # seconds since $1 (date +%s.%N), one decimal
    awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.1f", t1 - t0 }'
}

if [ "$(id -u)" -ne 0 ]; then
    log "needs root (debootstrap, chroot, mounts)"
    exit 2
fi
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
checkout=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
head=$(git -C "$checkout" rev-parse HEAD)
if [ -n "$(git -C "$checkout" status --porcelain --untracked-files=no)" ]; then
    log "note: uncommitted changes in $checkout are NOT checked (cloning HEAD ${head:0:12})"
fi

# ------------------------------------------------------------------ the pristine root (cached)
if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 -q update >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 -q install -y \
        --no-install-recommends debootstrap >&2
fi
stamp="$SUITE $MIRROR $INCLUDE"
started=$(date +%s.%N)
if $refresh || [ "$(cat "$PRISTINE.ok" 2>/dev/null)" != "$stamp" ]; then
    log "building the pristine $SUITE root in $PRISTINE (debootstrap, ~1-2 min)"
    mkdir -p "$CACHE"
    rm -rf "$PRISTINE" "$PRISTINE.tmp" "$PRISTINE.ok"
    debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$PRISTINE.tmp" "$MIRROR" >&2
    mv "$PRISTINE.tmp" "$PRISTINE"
    echo "$stamp" >"$PRISTINE.ok"
fi

# ------------------------------------------------------------------ the work root, and cleanup
work=$(mktemp -d /var/tmp/poprun-bare-check.XXXXXX)
root="$work/root"
mkdir "$work/logs"
mounted=()

# shellcheck disable=SC2317  # (trap handlers)
stop_inside() {
    # processes whose root is this chroot (sshd, slurmd, munged, ... of a test run): ours
    local pid pids=() sig
    for sig in TERM KILL; do
        pids=()
        for pid in /proc/[0-9]*; do
            [ "$(readlink "$pid/root" 2>/dev/null)" = "$root" ] && pids+=("${pid#/proc/}")
        done
        [ "${#pids[@]}" -eq 0 ] && return 0
        log "stopping ${#pids[@]} processes left in the chroot (SIG$sig)"
        kill "-$sig" "${pids[@]}" 2>/dev/null || true
        sleep 1
    done
}

# shellcheck disable=SC2317
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_inside
    # test hosts' links live in this machine's network stack: remove any a killed run left
    if [ -x "$root/root/poprun-py/.venv/bin/python" ]; then
        chroot "$root" env -i PATH="$CHROOT_PATH" /root/poprun-py/.venv/bin/python -c '
from poprun_py.testhosts import destroy_cluster, list_clusters
for name in list_clusters():
    destroy_cluster(name)' >/dev/null 2>&1 || true
    fi
    if [ "${#mounted[@]}" -gt 0 ]; then
        umount -R "$root" 2>/dev/null || umount -R -l "$root" 2>/dev/null || true
    fi
    if grep -q " $work" /proc/mounts; then
        log "still mounted under $work (left in place):"
        grep " $work" /proc/mounts >&2
    elif $keep; then
        log "kept the work root: $root"
    else
        rm -rf "$work"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "copying the pristine root to $root"
cp -a "$PRISTINE" "$root"

mount --bind "$root" "$root"
mounted+=("$root")
mount --make-private "$root"  # nothing mounted inside propagates to the host, nor back
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"  # with /sys/fs/cgroup: slurmd refuses to start without it
mount --make-rslave "$root/sys"
mount --bind /dev "$root/dev"
mount --make-slave "$root/dev"  # (a bind of a shared mount is shared: keep pts and shm here)
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=0755 tmpfs "$root/run"
# the host's test-host lock: host and chroot sessions share one network stack (subnets)
mkdir -p "$HOST_LOCK_DIR" "$root$HOST_LOCK_DIR"
touch "$HOST_LOCK_DIR/.lock" "$root$HOST_LOCK_DIR/.lock"
mount --bind "$HOST_LOCK_DIR/.lock" "$root$HOST_LOCK_DIR/.lock"
mount --make-slave "$root$HOST_LOCK_DIR/.lock"

cp /etc/resolv.conf "$root/etc/resolv.conf"
# debootstrap writes no /etc/hosts; an installed machine has this one (the test hosts add theirs)
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
    "$(hostname)" >"$root/etc/hosts"
cp "$HOST_CA" "$root/etc/ssl/host-ca.crt"
cp "$HOST_CA" "$root/etc/ssl/certs/ca-certificates.crt"
printf '[global]\ncert = /etc/ssl/host-ca.crt\n' >"$root/etc/pip.conf"
printf 'Acquire::https::CAInfo "/etc/ssl/host-ca.crt";\n' >"$root/etc/apt/apt.conf.d/99host-ca"
# the host's apt accepts its mirror's Release files as they are (a snapshot): do the same
if apt-config dump 2>/dev/null | grep -q '^Acquire::Check-Valid-Until "false"'; then
    printf 'Acquire::Check-Valid-Until "false";\n' >>"$root/etc/apt/apt.conf.d/99host-ca"
fi

chroot "$root" useradd --create-home --shell /bin/bash "$USER_NAME"
clone() {  # clone HEAD of the checkout to $root$1, owned by $2
    git clone --quiet --no-checkout "$checkout" "$root$1"
    git -C "$root$1" -c advice.detachedHead=false checkout --quiet --detach "$head"
    chown -R "$2:" "$root$1" 2>/dev/null || chroot "$root" chown -R "$2:" "$1"
}
clone /root/poprun-py root
clone "/home/$USER_NAME/poprun-py" "$USER_NAME"
log "root ready in $(elapsed "$started") s"

# ------------------------------------------------------------------ the steps
results=()
failed=0
ci_env=()
[ -n "${CI:-}" ] && ci_env=("CI=$CI")

steps=0
step() {  # step [--info] LABEL USER COMMAND...; output also in $work/logs/<n>.log
    local counts=true label user home t0 rc=0 how=() env_ci=("${ci_env[@]}")
    if [ "$1" = --info ]; then
        counts=false
        shift
    fi
    label=$1 user=$2
    shift 2
    steps=$((steps + 1))
    if [ "$user" = root ]; then
        home=/root
    else
        home="/home/$user"
        how=(--userspec="$user:$user")
        env_ci=()  # CI=true would turn every root-only test into a failure
    fi
    log "== $label"
    t0=$(date +%s.%N)
    # shellcheck disable=SC2016  # $HOME and $@ expand inside the chroot
    # (env --default-signal: a background job starts with SIGINT and SIGQUIT ignored, which
    # its children would inherit: the tests send SIGINT)
    chroot "${how[@]}" "$root" env --default-signal=INT,QUIT -i HOME="$home" USER="$user" LOGNAME="$user" \
        PATH="$CHROOT_PATH" LANG=C.UTF-8 TERM="${TERM:-dumb}" "${env_ci[@]}" \
        /bin/bash -c 'cd "$HOME/poprun-py" && "$@"' bash "$@" 2>&1 |
        tee "$work/logs/$steps.log" &
    wait "$!" || rc=$?  # (pipefail: the command's code) in the background: a signal is seen at once
    results+=("$(printf '%-34s %7s s  exit %d' "$label" "$(elapsed "$t0")" "$rc")$(pytest_counts "$work/logs/$steps.log")")
    log "$label: exit $rc"
    if ! $counts; then
        results[-1]+="  (informational: not counted)"
    elif [ "$rc" -ne 0 ]; then
        failed=1
    fi
    return 0
}

pytest_counts() {  # pytest's final counts in a step's log ("  (1100 passed, 12 skipped)"), if any
    local line
    line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)[a-z]*.* in [0-9.]+s' "$1" | tail -n 1 |
        sed -E 's/^=+ //; s/ in [0-9.]+s.*//') || true
    [ -z "$line" ] || printf '  (%s)' "$line"
}

read -r -a extra <<<"$example_args"
# an ordinary user first, as on a fresh machine; then root (which also installs the packages)
step "$USER_NAME: example.sh (first run)" "$USER_NAME" scripts/example.sh "${extra[@]}"
step "$USER_NAME: example.sh (second run)" "$USER_NAME" scripts/example.sh "${extra[@]}"
fast_path=$steps
# without root nor the Debian packages: what needs them skips, naming it; the run must pass
$quick || step "$USER_NAME: test.sh" "$USER_NAME" scripts/test.sh
step "root: example.sh (first run)" root scripts/example.sh "${extra[@]}"
$quick || step "root: test.sh" root scripts/test.sh
# the fast path: the second run must not have created the venv nor run pip
if grep -q '^venv: \(creating\|installing\)' "$work/logs/$fast_path.log"; then
    log "FAIL: the second example.sh run set up .venv again"
    results+=("(the second example.sh run set up .venv again: FAIL)")
    failed=1
fi

echo
echo "bare-check: Debian 12 ($SUITE minbase), HEAD ${head:0:12}, logs in $work/logs (with --keep)"
printf '  %s\n' "${results[@]}"
printf '  %-34s %7s s\n' "total (root set-up included)" "$(elapsed "$started")"
exit "$failed"
