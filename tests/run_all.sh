#!/usr/bin/env bash
# Every test, in the order a failure is cheapest to find: unit, then lint beside the real-stack tier
# (while the lab boots and seeds in the background), lab integration (with the molecule scenarios),
# run side by side on lab slots. Called by `make test` (after the apt packages are in place; the
# venv is built here, next to the lab's base image) and, with the argument `lab`, by
# `make test-lab` (lab stages only).
# Brings the lab up and always takes it down again, then prints the timing table
# (tests/times_report.py -> artifacts/test-times.md) whatever happened.
#
#   DDTREE_LAB_SLOTS   lab slots = xdist workers for the lab stage (default 3: the lab tests mostly
#                      wait on services, timers and SSH, so three overlap well on two cores)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
SLOTS=${DDTREE_LAB_SLOTS:-3}
ONLY=${1:-all}
TIMES=artifacts/times
rm -rf "$TIMES" artifacts/logs
mkdir -p "$TIMES" artifacts/logs
t0=$(date +%s)

# run_stage KEY NAME CMD...: run one stage, record its start, end and exit status for the table.
run_stage() {
  local key=$1 name=$2 start rc=0
  shift 2
  printf '\n=== %s (%ss)\n' "$name" "$(( $(date +%s) - t0 ))"
  start=$(date +%s.%N)
  "$@" || rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$key" "$start" "$(date +%s.%N)" "$rc" >> "$TIMES/stages.tsv"
  return "$rc"
}

lab_down() {
  run_stage lab-down "lab down (must leave no process, mount, netns, veth or cgroup behind)" \
    python3 lab/labctl.py down
}

# Whole-machine CPU every 5 s (artifacts/times/cpu.txt) for the timing table's "CPU busy" column.
# Measured with it: the lab stage keeps the two cores about 91 % busy, so work run beside it (even
# at nice 19: the lab hosts are cgroups of their own, which nice does not reach) lengthens it by
# about its own CPU time; lint and the real tier therefore run before it, not beside it.
cpu_sample() { printf '%s %s\n' "$(date +%s.%N)" "$(head -n 1 /proc/stat)"; }
cpu_sampler() {
  echo "# cores $(nproc)"
  while :; do cpu_sample; sleep 5; done
}

finish() {
  local rc=$?
  trap - EXIT
  if [ -n "${LAB_UP_PID:-}" ]; then   # a failure before the lab was up: let it finish, then down
    echo "waiting for the lab's start-up to end before taking it down" >&2
    wait "$LAB_UP_PID" || true
  fi
  if [ -n "${REAL_VENV_PID:-}" ]; then wait "$REAL_VENV_PID" 2>/dev/null || true; fi
  if [ -n "${LINT_PID:-}" ]; then wait "$LINT_PID" 2>/dev/null || true; fi
  if [ -n "${LAB_STARTED:-}" ]; then lab_down || rc=$?; fi
  if [ -n "${CPU_PID:-}" ]; then kill "$CPU_PID" 2>/dev/null || true; cpu_sample >> "$TIMES/cpu.txt"; fi
  printf '\n=== timing table (%ss)\n' "$(( $(date +%s) - t0 ))"
  python3 tests/times_report.py || true
  printf '\n=== done: exit %s after %ss\n' "$rc" "$(( $(date +%s) - t0 ))"
  exit "$rc"
}
trap finish EXIT
cpu_sampler > "$TIMES/cpu.txt" 2>/dev/null &
CPU_PID=$!

# The lab comes up in the background (its output in artifacts/logs/lab-up.log) while the venv is
# built and the unit tests and lint run: first the base image (debootstrap, cached), which needs
# nothing from the venv, then, once the venv is there, `make lab-up` (mirror, hosts, seed, slots).
# Unit and lint still report first, the cheapest failures to find.
lab_bringup() {
  run_stage lab-image "lab base image (debootstrap; cached by recipe)" python3 lab/labctl.py image
  until [ -e "$TIMES/venv.done" ]; do
    [ -e "$TIMES/venv.failed" ] && return 1
    sleep 1
  done
  run_stage lab-up "lab up + seed ($SLOTS lab slots of ct129 + ct200, known-good NEXTN on every host)" \
    make --no-print-directory lab-up SLOTS="$SLOTS"
}
LAB_STARTED=1
printf '\n=== lab image, up + seed, in the background: artifacts/logs/lab-up.log (%ss)\n' "$(( $(date +%s) - t0 ))"
lab_bringup >artifacts/logs/lab-up.log 2>&1 &
LAB_UP_PID=$!

run_stage venv "venv (the pinned controller toolchain)" make --no-print-directory venv \
  || { touch "$TIMES/venv.failed"; exit 1; }
touch "$TIMES/venv.done"

if [ "$ONLY" = all ]; then
  run_stage unit "unit tests" pytest -q -n "${UNIT_WORKERS:-4}" tests/unit --times-json "$TIMES/unit.json"
  # The real-stack tier's venv (sglang 0.5.23 + torch, 11 GB, cached outside the checkout) installs
  # in the background during lint: about 6 min the first time on a machine, nothing afterwards.
  # Not during the unit tests: some of them pace a stand-in's tokens and fail a rate floor when
  # the install takes their CPU (seen in CI: 57.6 tokens/s < 60).
  printf '\n=== real sglang venv, in the background: artifacts/logs/real-venv.log (%ss)\n' "$(( $(date +%s) - t0 ))"
  run_stage real-venv "real tier venv (tests/real/setup.sh: sglang 0.5.23 + torch, cached)" \
    bash tests/real/setup.sh >artifacts/logs/real-venv.log 2>&1 &
  REAL_VENV_PID=$!
  # Lint and the real tier side by side, while the lab waits for both: neither fills the two
  # cores (the CPU busy column measured lint at 70 %, the real tier at 48 %, one after the other).
  # Lint's output goes to artifacts/logs/lint.log and is printed when both are done.
  run_stage lint "lint (beside the real tier)" make --no-print-directory lint >artifacts/logs/lint.log 2>&1 &
  LINT_PID=$!
  if ! wait "$REAL_VENV_PID"; then
    REAL_VENV_PID=
    echo "the real tier's venv did not install; the end of artifacts/logs/real-venv.log:" >&2
    tail -n 40 artifacts/logs/real-venv.log >&2
    exit 1
  fi
  REAL_VENV_PID=
  real_rc=0
  run_stage real "real tier (the patched worker under the real sglang 0.5.23 and torch, CPU; beside lint)" \
    "$(tail -n 1 artifacts/logs/real-venv.log)/bin/python" -m pytest -q -p no:cacheprovider -W ignore tests/real \
      --times-json "$TIMES/real.json" || real_rc=$?
  lint_rc=0
  wait "$LINT_PID" || lint_rc=$?
  LINT_PID=
  printf '\n=== lint (ran beside the real tier): artifacts/logs/lint.log\n'
  cat artifacts/logs/lint.log
  if [ "$lint_rc" != 0 ] || [ "$real_rc" != 0 ]; then
    echo "lint exited $lint_rc, the real tier $real_rc" >&2
    exit 1
  fi
fi

printf '\n=== waiting for the lab (%ss)\n' "$(( $(date +%s) - t0 ))"
if ! wait "$LAB_UP_PID"; then
  LAB_UP_PID=
  echo "lab up failed; the end of artifacts/logs/lab-up.log:" >&2
  tail -n 80 artifacts/logs/lab-up.log >&2
  exit 1
fi
LAB_UP_PID=
grep -E '^(\[lab|lab seed)' artifacts/logs/lab-up.log | tail -n 30

# One xdist worker per lab slot; groups and their order: tests/integration/conftest.py. Each
# failure is reported with its own output; each playbook run is also logged on its own under
# artifacts/logs/slot<k>/<test>/.
run_stage integration "lab integration + molecule ($SLOTS workers side by side)" \
  pytest -q -p no:cacheprovider -n "$SLOTS" --dist loadscope --no-loadscope-reorder tests/integration \
    --times-json "$TIMES/integration.json"

LAB_STARTED=
lab_down
