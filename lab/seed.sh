#!/usr/bin/env bash
# Seed the lab: lab/playbooks/lab_seed.yml (known-good NEXTN through the project's own roles) on the
# main lab (and, side by side, on every lab slot already booted), then keep a snapshot of every
# seeded host's disk (`labctl snapshot`). `labctl up --slots K` starts new slot hosts from a copy
# of these snapshots, and the lab tests go back to the seeded state with `labctl reset` instead
# of a redeploy. Each slot's run is logged to artifacts/logs/seed-slot<k>.log; a failed seed
# prints its log's tail and fails.
set -uo pipefail
cd "$(dirname "$0")/.."
STATE=${DDTREE_LAB_STATE:-/var/lib/ddtree-lab}
LOGS=artifacts/logs
mkdir -p "$LOGS"
PLAYBOOK=${PLAYBOOK:-ansible-playbook}
declare -A pids
for inv in inventory/lab "$STATE"/slots/*/inventory; do
  [ -d "$inv" ] || continue
  case "$inv" in
    inventory/lab) slot=0 ;;
    *) slot=$(basename "$(dirname "$inv")") ;;
  esac
  log="$LOGS/seed-slot$slot.log"
  if [ "$slot" = 0 ]; then
    "$PLAYBOOK" lab/playbooks/lab_seed.yml >"$log" 2>&1 &
  else
    ANSIBLE_INVENTORY="$inv" ANSIBLE_CACHE_PLUGIN_CONNECTION="$PWD/.ansible/facts-slot$slot" \
      "$PLAYBOOK" lab/playbooks/lab_seed.yml >"$log" 2>&1 &
  fi
  pids[$slot]=$!
done
# machines SLOT: the slot's machine names, from the hosts.json labctl wrote (labctl snapshot finds
# each one from the record next to its disk).
machines() {
  local json="$STATE/hosts.json"
  [ "$1" = 0 ] || json="$STATE/slots/$1/hosts.json"
  python3 -c 'import json,sys; print(" ".join(h.get("machine", h["name"]) for h in json.load(open(sys.argv[1]))))' "$json"
}
rc=0
for slot in $(printf '%s\n' "${!pids[@]}" | sort -n); do
  if wait "${pids[$slot]}"; then
    echo "lab seed: slot $slot seeded ($(grep -A3 'PLAY RECAP' "$LOGS/seed-slot$slot.log" | grep -c 'failed=0') hosts ok)"
    # shellcheck disable=SC2046  # one argument per machine name
    if ! python3 lab/labctl.py snapshot $(machines "$slot") >>"$LOGS/seed-slot$slot.log" 2>&1; then
      rc=1
      echo "lab seed: the snapshot of slot $slot failed; the end of $LOGS/seed-slot$slot.log:" >&2
      tail -n 20 "$LOGS/seed-slot$slot.log" >&2
    fi
  else
    rc=1
    echo "lab seed: slot $slot FAILED; the end of $LOGS/seed-slot$slot.log:" >&2
    tail -n 60 "$LOGS/seed-slot$slot.log" >&2
  fi
done
exit $rc
