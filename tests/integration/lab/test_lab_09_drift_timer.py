"""The drift schedule on a real control node: ct200 doubles as one (ansible-core from the lab
mirror, this checkout copied over), the drift_timer role installs the timer and service, and
the service started by hand runs the real drift.yml against ct200 itself (local connection)."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

import labkit

PROJECT = "/opt/ddtree-fleet"
TIMER_VARS = json.dumps({"ddtree_controllers": "ct200", "drift_timer_project_dir": PROJECT,
                         "drift_timer_command": f"{PROJECT}/.venv/bin/ansible-playbook -i inventory/selfhost drift.yml"})
SELF_INVENTORY = """---
sglang_servers:
  children:
    sm120:
      hosts:
        ct200:
          ansible_connection: local
          ansible_python_interpreter: /usr/bin/python3
"""


@pytest.fixture(scope="module")
def control_node(lab):
    files = subprocess.run(["git", "ls-files", "-z"], cwd=labkit.REPO, capture_output=True, check=True).stdout
    tar = subprocess.run(["tar", "-C", str(labkit.REPO), "--null", "-T", "-", "-cf", "-"], input=files,
                         capture_output=True, check=True).stdout
    subprocess.run(labkit.ssh_argv("ct200", f"rm -rf {PROJECT} && mkdir -p {PROJECT} && tar -C {PROJECT} -xf -"),
                   input=tar, check=True, capture_output=True, timeout=120)
    t0 = time.monotonic()
    labkit.ssh("ct200", f"python3 -m venv {PROJECT}/.venv && {PROJECT}/.venv/bin/pip install -q --no-input "
                        "--index-url http://10.213.0.1:8873/simple/ --trusted-host 10.213.0.1 ansible-core==2.19.14",
               timeout=600)
    # The lab's controller-side hash lock (inventory/lab: sglang_requirements_lock), where a lab
    # controller has it: a control node of the lab installs the same venvs.
    lock = Path(os.environ.get("DDTREE_LAB_CACHE", "/var/cache/ddtree-lab")) / "mirror" / "requirements-lab.lock"
    subprocess.run(labkit.ssh_argv("ct200", f"mkdir -p {lock.parent} && cat > {lock}"), input=lock.read_bytes(),
                   check=True, capture_output=True, timeout=60)
    lab_vars = (labkit.REPO / "inventory" / "lab" / "group_vars" / "all.yml").read_text()
    labkit.ssh("ct200", f"mkdir -p {PROJECT}/inventory/selfhost/group_vars && "
                        f"printf %s {shlex.quote(SELF_INVENTORY)} > {PROJECT}/inventory/selfhost/hosts.yml && "
                        f"printf %s {shlex.quote(lab_vars)} > {PROJECT}/inventory/selfhost/group_vars/all.yml")
    labkit.record_timing("control node on ct200 (copy + ansible-core venv)", seconds=time.monotonic() - t0)
    run = labkit.run_playbook("playbooks/drift_timer.yml", "-e", TIMER_VARS)
    assert run.rc == 0, run
    yield run
    labkit.ssh("ct200", "systemctl disable --now ddtree-drift.timer; rm -f /etc/systemd/system/ddtree-drift.*; "
                        f"systemctl daemon-reload; rm -rf {PROJECT}; rm -f {lock}", check=False)


def test_units_verify_and_the_timer_is_scheduled(control_node):
    res = labkit.ssh("ct200", "systemd-analyze verify /etc/systemd/system/ddtree-drift.service "
                              "/etc/systemd/system/ddtree-drift.timer", check=False)
    assert res.returncode == 0 and "ddtree-drift" not in res.stderr, res.stderr
    assert labkit.ssh("ct200", "systemctl is-enabled ddtree-drift.timer").stdout.strip() == "enabled"
    assert labkit.ssh("ct200", "systemctl is-active ddtree-drift.timer").stdout.strip() == "active"
    show = labkit.ssh("ct200", "systemctl show ddtree-drift.timer -p NextElapseUSecRealtime -p Persistent").stdout
    assert "Persistent=yes" in show and "NextElapseUSecRealtime=\n" not in show + "\n"
    again = labkit.run_playbook("playbooks/drift_timer.yml", "-e", TIMER_VARS)
    assert again.rc == 0 and again.recap("ct200")["changed"] == 0, again


def test_service_started_by_hand_runs_drift_and_writes_the_report(control_node):
    t0 = time.monotonic()
    res = labkit.ssh("ct200", "systemctl start ddtree-drift.service", check=False, timeout=900)
    took = time.monotonic() - t0
    journal = labkit.ssh("ct200", "journalctl -u ddtree-drift.service --no-pager -o cat").stdout
    assert res.returncode == 0, journal[-3000:]
    assert labkit.ssh("ct200", "systemctl show ddtree-drift.service -p Result --value").stdout.strip() == "success"
    assert "PLAY RECAP" in journal and "ct200" in journal
    report = json.loads(labkit.read_text("ct200", f"{PROJECT}/artifacts/drift/latest.json"))
    entry = next(h for h in report["hosts"] if h["host"] == "ct200")
    assert entry["status"] in ("corrected", "in_sync"), entry
    prom = labkit.read_text("ct200", f"{PROJECT}/artifacts/drift/ddtree_fleet_drift.prom")
    assert f'ddtree_fleet_drift_status{{host="ct200",status="{entry["status"]}"}} 1' in prom
    labkit.record_timing("drift.service run on the ct200 control node", seconds=took, status=entry["status"])


def test_a_second_run_never_overlaps(control_node):
    # Hold the run lock the way a running drift would; the service must give up at once.
    # Wait until the holder really has the lock (a fixed sleep lost the race under CI load, and
    # the drift then ran and exited 0): flock -n fails only while it is held.
    labkit.ssh("ct200", "mkdir -p /run/ddtree-fleet && systemd-run --unit=hold-drift-lock --collect "
                        "flock /run/ddtree-fleet/drift.lock sleep 60 && "
                        "for i in $(seq 100); do flock -n /run/ddtree-fleet/drift.lock true || exit 0; sleep 0.1; done; "
                        "echo 'the holder never took the lock' >&2; exit 1")
    t0 = time.monotonic()
    res = labkit.ssh("ct200", "systemctl start ddtree-drift.service", check=False, timeout=120)
    took = time.monotonic() - t0
    status = labkit.ssh("ct200", "systemctl show ddtree-drift.service -p ExecMainStatus --value").stdout.strip()
    assert res.returncode == 0 and status == "75", (res.stderr, status)
    assert took < 10, took
    labkit.ssh("ct200", "systemctl stop hold-drift-lock", check=False)
