#!/usr/bin/env bash
# make demo: the incident as one command on the lab fleet (booted and seeded by make lab-up).
# Both hosts serve the known-good NEXTN unit; deploy_ddtree.yml tries DDTREE on both.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" ANSIBLE_CONFIG="$PWD/ansible.cfg"
echo "== ansible-playbook deploy_ddtree.yml  (DDTREE on ct129/sm86 and ct200/sm120)"
t0=$(date +%s)
ansible-playbook deploy_ddtree.yml 2>&1 | tee /tmp/ddtree-demo.log | grep -E "gate (pass|fail)|promoted|quarantined|restoring|RESTORED|FAILED!|^ct[0-9]+ +:" | sed 's/^/   /'
rc=${PIPESTATUS[0]}
t1=$(date +%s)
printf '\n== play exit code %s after %s s (full log: /tmp/ddtree-demo.log)\n' "$rc" "$((t1 - t0))"
echo "== what each host serves now"
for h in ct129 ct200; do
  ns="ddl-$h"
  algo=$(ip netns exec "$ns" python3 -c 'import json,urllib.request as u; print(json.load(u.urlopen("http://127.0.0.1:30000/server_info", timeout=5)).get("speculative_algorithm"))' 2>/dev/null)
  verdict=$(ip netns exec "$ns" .venv/bin/python bin/ddtree-probe probe --url http://127.0.0.1:30000 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["verdict"], "in", r["detection_seconds"], "s")')
  echo "   $h: $algo, probe: $verdict"
done
echo "== evidence collected for failed changes"
ls -d artifacts/ct*/2* 2>/dev/null | tail -n 5 | sed 's/^/   /'
latest=$(ls -d artifacts/ct129/* 2>/dev/null | tail -n 1)
if [ -n "$latest" ]; then
  echo "== $latest/summary.json"
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("   verdict:", s["verdict"]); [print("   reason:", r) for r in s["reasons"]]' "$latest/summary.json"
fi
echo "== a second run changes nothing (ct129 stays quarantined on NEXTN, ct200 on DDTREE)"
ansible-playbook deploy_ddtree.yml 2>&1 | grep -E "^ct[0-9]+ +:" | sed 's/^/   /'
exit 0
