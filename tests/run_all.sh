#!/usr/bin/env bash
# Every test, in the order a failure is cheapest to find: unit, lint, lab integration, molecule.
# Called by `make test` (after the venv and apt packages are in place); brings the lab up and
# always takes it down again.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
PY=.venv/bin/python
t0=$(date +%s)
stage() { printf '\n=== %s (%ss)\n' "$1" "$(( $(date +%s) - t0 ))"; }

stage "unit tests"
pytest -q tests/unit

stage "lint"
make --no-print-directory lint

stage "lab up + seed (known-good NEXTN on every host)"
trap 'stage "lab down"; python3 lab/labctl.py down || true' EXIT
make --no-print-directory lab-up

stage "lab integration tests"
pytest -q -p no:cacheprovider tests/integration

stage "molecule"
for scenario in default deploy; do
  (cd molecule/.. && molecule test -s "$scenario")
done

stage "lab down (must leave no process, mount, netns, veth or cgroup behind)"
trap - EXIT
python3 lab/labctl.py down

stage "done"
