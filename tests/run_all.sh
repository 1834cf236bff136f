#!/usr/bin/env bash
# Every test: the unit tier (while the lab boots and seeds in the background), then lab integration
# (with the molecule scenarios) run side by side on lab slots, with lint and the real-stack tier
# beside it at the lowest CPU priority (the lab stage is CPU-bound on two cores; these two take
# only the CPU it leaves idle, and their output is printed when it ends). Called by `make test`
# (after the apt packages are in place; the venv is built here, next to the lab's base image)
# and, with the argument `lab`, by `make test-lab` (lab stages only).
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
cpu_sample() { printf '%s %s\n' "$(date +%s.%N)" "$(head -n 1 /proc/stat)"; }
cpu_sampler() {
  echo "# cores $(nproc)"
  while :; do cpu_sample; sleep 5; done
}

# Lint and the real tier (its venv first: sglang 0.5.23 + torch, 11 GB, cached outside the
# checkout, about 6 min the first time on a machine), each with its own log, at nice 19.
side_checks() {
  renice -n 19 -p "$BASHPID" >/dev/null || true
  run_stage real-venv "real tier venv (tests/real/setup.sh: sglang 0.5.23 + torch, cached)" \
    bash tests/real/setup.sh >artifacts/logs/real-venv.log 2>&1 || { echo real-venv > "$TIMES/side.failed"; return 1; }
  run_stage lint "lint (beside the lab stage, nice 19)" make --no-print-directory lint \
    >artifacts/logs/lint.log 2>&1 || echo lint >> "$TIMES/side.failed"
  run_stage real "real tier (the patched worker under the real sglang 0.5.23 and torch, CPU; beside the lab stage, nice 19)" \
    "$(tail -n 1 artifacts/logs/real-venv.log)/bin/python" -m pytest -q -p no:cacheprovider -W ignore tests/real \
      --times-json "$TIMES/real.json" >artifacts/logs/real.log 2>&1 || echo real >> "$TIMES/side.failed"
}

# side_report: wait for the side checks, print their logs; fails when one of them failed.
side_report() {
  local pid=$SIDE_PID
  SIDE_PID=
  wait "$pid" || true
  if grep -qsx real-venv "$TIMES/side.failed"; then
    echo "the real tier's venv did not install; the end of artifacts/logs/real-venv.log:" >&2
    tail -n 40 artifacts/logs/real-venv.log >&2
  fi
  for log in lint real; do
    [ -e "artifacts/logs/$log.log" ] || continue
    printf '\n=== %s (ran beside the lab stage): artifacts/logs/%s.log\n' "$log" "$log"
    tail -n 60 "artifacts/logs/$log.log"
  done
  if [ -e "$TIMES/side.failed" ]; then
    echo "failed beside the lab stage: $(tr '\n' ' ' < "$TIMES/side.failed")" >&2
    return 1
  fi
}

finish() {
  local rc=$?
  trap - EXIT
  if [ -n "${SIDE_PID:-}" ]; then side_report || rc=1; fi
  if [ -n "${LAB_UP_PID:-}" ]; then   # a failure before the lab was up: let it finish, then down
    echo "waiting for the lab's start-up to end before taking it down" >&2
    wait "$LAB_UP_PID" || true
  fi
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
# built and the unit tests run: first the base image (debootstrap, cached), which needs
# nothing from the venv, then, once the venv is there, `make lab-up` (mirror, hosts, seed, slots).
# The unit tier still reports first, the cheapest failures to find.
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

# Not during the unit tests: some of them pace a stand-in's tokens and fail a rate floor when an
# install takes their CPU (seen in CI: 57.6 tokens/s < 60); the lab tests' rates are checked
# against their own baselines, and nice 19 leaves them the CPU.
if [ "$ONLY" = all ]; then
  printf '\n=== lint and the real tier, beside the lab stage at nice 19: artifacts/logs/{real-venv,lint,real}.log (%ss)\n' \
    "$(( $(date +%s) - t0 ))"
  side_checks &
  SIDE_PID=$!
fi

# One xdist worker per lab slot; groups and their order: tests/integration/conftest.py. Each
# failure is reported with its own output; each playbook run is also logged on its own under
# artifacts/logs/slot<k>/<test>/.
run_stage integration "lab integration + molecule ($SLOTS workers side by side)" \
  pytest -q -p no:cacheprovider -n "$SLOTS" --dist loadscope --no-loadscope-reorder tests/integration \
    --times-json "$TIMES/integration.json"

LAB_STARTED=
lab_down
if [ -n "${SIDE_PID:-}" ]; then side_report; fi
