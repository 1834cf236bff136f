#!/usr/bin/env bash
# The real-stack tier's venv: sglang==0.5.23 and torch as pinned in tests/real/requirements.txt.
# Cached outside the checkout (11 GB), keyed by the requirements' sha256: a second run, or a
# fresh clone on the same machine, reuses it. Prints the venv's path as its last line.
#   DDTREE_REAL_CACHE  where the venvs live (default /var/cache/ddtree-fleet)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
req="$here/requirements.txt"
key=$(sha256sum "$req" | cut -c1-12)
venv="${DDTREE_REAL_CACHE:-/var/cache/ddtree-fleet}/real-sglang-$key"
if [ ! -f "$venv/.installed" ]; then
  t0=$(date +%s)
  echo "real tier: installing $(grep -c '==' "$req") pinned packages into $venv" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  if ! "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" >"$venv.log" 2>&1; then
    grep -v "^WARNING: Location" "$venv.log" | tail -n 40 >&2
    exit 1
  fi
  "$venv/bin/python" -c "import sglang, torch; assert sglang.__version__ == '0.5.23', sglang.__version__" >&2
  echo "$(( $(date +%s) - t0 ))" > "$venv/.installed"
  echo "real tier: installed in $(cat "$venv/.installed") s ($(du -sh "$venv" | cut -f1))" >&2
else
  echo "real tier: reusing $venv (installed in $(cat "$venv/.installed") s)" >&2
fi
echo "$venv"
