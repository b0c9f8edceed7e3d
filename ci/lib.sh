# Sourced by every CI stage: run from the checkout's root, with what the stage needs installed.
# scripts/test runs scripts/setup once and exports SLONK_SETUP_DONE=1 so its stages skip it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
stage="ci/$(basename "$0")"

say() { echo "$stage: $*" >&2; }

# setup [--python]: the machine set up (--python: only .venv, for the stages that need no root).
setup() {
  [[ ${SLONK_SETUP_DONE:-} == 1 ]] || scripts/setup "$@"
}

need_root() {
  ((EUID == 0)) || { say "needs root (network namespaces, mounts, podman's store)"; exit 1; }
}

# run_tests DIR [PYTEST ARGS...]: pytest over DIR. With a -k or -m selection a stage may
# select nothing, which is no failure of that stage; without one, no test is a failure.
run_tests() {
  local rc=0 selects=0 arg
  for arg in "${@:2}"; do
    [[ $arg == -k* || $arg == -m* ]] && selects=1
  done
  .venv/bin/pytest "$@" || rc=$?
  if ((rc == 5 && selects)); then
    say "no test selected here"
    return 0
  fi
  return "$rc"
}
