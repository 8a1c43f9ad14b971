#!/usr/bin/env bash
# The suite's second CI profile (issue 26, item 5): the tests most sensitive to their
# environment, run on a machine that looks different from the first run's. .ci/run runs it after
# scripts/test.sh (which has installed everything: this script installs nothing).
#
# What differs:
#   HOME               a fresh temporary directory, not the user's home in /etc/passwd (where
#                      ssh looks, and where the test hosts' root logins land): tests may not
#                      confuse the runner's HOME with the hosts' home or read the runner's files;
#   OPENBLAS_CORETYPE=Haswell, OPENBLAS_L2_SIZE=262144
#                      a BLAS tuning environment such as clusters set (numpy, mpi4py, the
#                      example training must start with it);
#   COLUMNS=40         a narrow terminal: rich tables wrap (tools' output that tests parse);
#   LANG=C             (LC_ALL and LC_CTYPE unset) an ASCII locale, no UTF-8 default;
#   http_proxy, https_proxy, HTTP_PROXY, HTTPS_PROXY = http://127.0.0.1:9 (nothing listens):
#                      a proxy that goes nowhere; loopback and test hosts must not go through it;
#   taskset -c CPU     one CPU (the first this process may use): binding, slot and topology
#                      code must not assume CPUs 0-1, and polls must not depend on a second core.
#
# Which tests (the whole suite on one CPU would take about as long again as test.sh's run on
# two; .ci/run must stay well inside its 90 minutes next to test.sh's ~8 and bare-check's ~12.5):
#   tests/unit                                every unit test: fast, and where HOME, locale,
#                                             COLUMNS, CPUs and XDG directories are read;
#   tests/integration/test_local_backend.py   local instances: binding on this CPU set,
#                                             OPENBLAS_* reaching numpy in the example training;
#   test_mpirun_local.py                      Open MPI and mpi4py on one CPU with OPENBLAS_*;
#   test_everyday_remote_env.py               what an instance's environment gets (HOME, LANG,
#                                             proxies must not leak into or break it);
#   test_long_run_local.py                    restarts, hang detection and py-spy on one CPU;
#   test_detached_local.py, test_everyday_job_files.py
#                                             job roots, records and XDG directories with
#                                             another HOME;
#   test_everyday_preflight_local.py, test_injection_local.py
#                                             preflight messages and quoting under LANG=C;
#   test_provision_local.py                   provisioning: setup's markers in the hosts' home,
#                                             not the runner's HOME;
#   test_provision_aws.py                     moto on loopback with the proxy variables set;
#   test_ssh_oracle.py, test_ssh_options_hosts.py
#                                             ssh's and poprun-py's reading of ssh config,
#                                             identities and known_hosts with another HOME;
#   test_host_tools.py                        rich tables parsed at COLUMNS=40.
# The test hosts' own processes are started by their sshd: they run with a login's environment
# whatever this script sets (the first run covers the rest of the host tests).
#
# With CI=true (as in .ci/run) any skip but the allowed ones fails, as in test.sh.
# Usage: scripts/test-profile.sh [extra pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/venv.sh
. scripts/venv.sh
venv_ready test

profile_home=$(mktemp -d /tmp/poprun-profile-home.XXXXXX)
trap 'rm -rf "$profile_home"' EXIT
cpu=$("$VENV_PYTHON" -c 'import os; print(min(os.sched_getaffinity(0)))')
nowhere=http://127.0.0.1:9

tests=(
    tests/unit
    tests/integration/test_local_backend.py
    tests/integration/test_mpirun_local.py
    tests/integration/test_everyday_remote_env.py
    tests/integration/test_long_run_local.py
    tests/integration/test_detached_local.py
    tests/integration/test_everyday_job_files.py
    tests/integration/test_everyday_preflight_local.py
    tests/integration/test_injection_local.py
    tests/integration/test_provision_local.py
    tests/integration/test_provision_aws.py
    tests/integration/test_ssh_oracle.py
    tests/integration/test_ssh_options_hosts.py
    tests/integration/test_host_tools.py
)

echo "== pytest, second profile: HOME=$profile_home, CPU $cpu only, COLUMNS=40, LANG=C," \
    "OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=262144, proxies at $nowhere"
started=$SECONDS
status=0
env -u LC_ALL -u LC_CTYPE \
    HOME="$profile_home" \
    OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=262144 \
    COLUMNS=40 LANG=C \
    http_proxy=$nowhere https_proxy=$nowhere HTTP_PROXY=$nowhere HTTPS_PROXY=$nowhere \
    taskset -c "$cpu" \
    "$VENV_PYTHON" -m pytest -q -rfEs -p no:cacheprovider --durations=10 "${tests[@]}" "$@" ||
    status=$?
echo "test-profile.sh: exit $status after $((SECONDS - started)) s"
exit "$status"
