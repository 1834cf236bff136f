"""Secrets never leak, and the service runs locked down.

Canary secrets (an SGLang API key and an HF token, random per session) come from the
environment, as inventory/production reads them (inventory/lab does the same). Then a --check
--diff run, a change that fails the gate (evidence), a change that passes (a known-good record)
and a drift run; afterwards everything the tool wrote -- play output, artifacts/, .ansible/, the
host's journal and files -- is searched for the canaries. They may live only in the service's
EnvironmentFile, the known-good record's copy of it and the snapshot taken before a change, all
0600 and owned by the service user.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess

import labkit
import pytest

HOST = "ct200"
KEY = f"ddtree-canary-key-{secrets.token_hex(12)}"
TOKEN = f"hf_ddtreecanary{secrets.token_hex(12)}"
CANARIES = (KEY, TOKEN)
# The EnvironmentFile, the known-good record's copy, and the pre-change snapshot of it.
ALLOWED_ON_HOST = re.compile(r"^(/etc/sglang/sglang\.env|/var/lib/ddtree-fleet/records/[0-9a-f]+/env"
                             r"|/var/lib/ddtree-fleet/staging/previous-sglang\.env)$")
FAULTS_ENV = "/etc/ddtree-lab/faults.env"


@pytest.fixture(scope="module")
def runs(lab):
    """Every play of the scenario, run with the canaries in the environment."""
    labkit.ensure_seeded("secrets")
    env = {"SGLANG_API_KEY": KEY, "HF_TOKEN": TOKEN}
    out = {}
    try:
        out["check_diff"] = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST, "--check", "--diff", env=env)
        labkit.ssh(HOST, f"printf 'DDTREE_LAB_FAULT=garbage_fast\\nDDTREE_LAB_FAULT_ONLY=DDTREE\\n' > {FAULTS_ENV}")
        out["failed_change"] = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST, "--diff", env=env)
        labkit.ssh(HOST, f"rm -f {FAULTS_ENV}")
        labkit.clear_quarantine(HOST)
        out["promoted"] = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST, "--diff", "-v",
                                              "-e", "sglang_speculative_algorithm=NEXTN", env=env)
        out["drift"] = labkit.run_playbook("drift.yml", "-l", HOST, "--diff", env=env)
        yield out
    finally:
        labkit.ssh(HOST, f"rm -f {FAULTS_ENV}")
        labkit.clear_quarantine(HOST)
        labkit.restore_seeded([HOST], "secrets: back to the seeded NEXTN without a key")


def test_the_scenario_ran_as_expected(runs):
    assert runs["check_diff"].rc == 0, str(runs["check_diff"])
    assert runs["failed_change"].rc == 2 and "the DDTREE change failed" in runs["failed_change"].out
    assert runs["promoted"].rc == 0, str(runs["promoted"])
    assert runs["drift"].rc == 0, str(runs["drift"])
    # The drift run converged the host to its declared DDTREE (with the key) through the gate.
    kg = labkit.known_good(HOST)
    assert kg["meta"]["algorithm"] == "DDTREE", kg


def test_the_service_requires_the_key_and_the_probe_sends_it(runs):
    probe = ("import sys, urllib.request, urllib.error\n"
             "def get(headers):\n"
             "    req = urllib.request.Request('http://127.0.0.1:30000/v1/models', headers=headers)\n"
             "    try:\n"
             "        return urllib.request.urlopen(req, timeout=5).status\n"
             "    except urllib.error.HTTPError as e:\n"
             "        return e.code\n"
             "print(get({}), get({'Authorization': 'Bearer ' + sys.stdin.read().strip()}))\n")
    res = subprocess.run(["ip", "netns", "exec", labkit.netns(HOST), "python3", "-c", probe], input=KEY,
                         capture_output=True, text=True, timeout=30)
    assert res.stdout.split() == ["401", "200"], (res.stdout, res.stderr)
    # The gate of the promoted run probed the keyed service and passed: it sent the key.
    assert re.search(r"quality gate pass", runs["promoted"].out), runs["promoted"].tail()


def test_no_canary_in_play_output(runs):
    for name, run in runs.items():
        for c in CANARIES:
            assert c not in run.out, f"a canary secret appears in the output of the {name} run"


def test_no_canary_in_anything_written_on_the_controller(runs):
    hits = []
    for root in (labkit.ARTIFACTS, labkit.REPO / ".ansible"):
        if not root.exists():
            continue
        for c in CANARIES:
            res = subprocess.run(["grep", "-rlF", "--", c, str(root)], capture_output=True, text=True)
            hits += res.stdout.split()
    assert not hits, f"canary secrets written on the controller: {hits}"


def test_canary_only_in_the_service_users_0600_env_files_on_the_host(runs):
    found = set()
    for c in CANARIES:
        res = labkit.ssh(HOST, f"grep -rlF -- {shlex.quote(c)} /etc /var /run /tmp /root /srv /home "
                               f"/opt/sglang --exclude-dir=venvs --exclude-dir=models 2>/dev/null || true")
        found |= set(res.stdout.split())
    assert found, "the canary is nowhere on the host: the key was not deployed at all"
    assert "/etc/sglang/sglang.env" in found
    leaked = sorted(p for p in found if not ALLOWED_ON_HOST.match(p))
    assert not leaked, f"canary secrets in files other than the EnvironmentFiles: {leaked}"
    for path in sorted(found):
        owner = labkit.ssh(HOST, f"stat -c '%a %U %G' {shlex.quote(path)}").stdout.split()
        assert owner == ["600", "sglang", "sglang"], f"{path} is {owner}"


def test_no_canary_in_the_journal(runs):
    for c in CANARIES:
        res = labkit.ssh(HOST, f"journalctl --no-pager -o cat | grep -cF -- {shlex.quote(c)} || true")
        assert res.stdout.strip() == "0", f"the journal holds a canary secret {res.stdout.strip()} times"


def test_the_service_runs_unprivileged_and_hardened(runs):
    props = dict(line.split("=", 1) for line in labkit.ssh(HOST, (
        "systemctl show sglang.service -p User -p NoNewPrivileges -p CapabilityBoundingSet -p AmbientCapabilities "
        "-p ProtectSystem -p ProtectHome -p PrivateTmp -p DevicePolicy -p DeviceAllow -p MainPID")).stdout.splitlines())
    assert props["User"] == "sglang" and props["NoNewPrivileges"] == "yes", props
    assert props["CapabilityBoundingSet"] == "" and props["AmbientCapabilities"] == "", props
    assert props["ProtectSystem"] == "strict" and props["ProtectHome"] == "yes" and props["PrivateTmp"] == "yes", props
    assert props["DevicePolicy"] == "closed" and "/dev/nvidiactl rw" in props["DeviceAllow"], props
    status = labkit.read_text(HOST, f"/proc/{props['MainPID']}/status")
    uid = re.search(r"^Uid:\s+(\d+)", status, re.M).group(1)
    caps = re.search(r"^CapEff:\s+(\w+)", status, re.M).group(1)
    assert uid != "0" and int(caps, 16) == 0, (uid, caps)
    # It listens only on the configured address (127.0.0.1:30000 = 0100007F:7530 in /proc/net/tcp).
    listening = {line.split()[1] for line in labkit.read_text(HOST, "/proc/net/tcp").splitlines()[1:]
                 + labkit.read_text(HOST, "/proc/net/tcp6").splitlines()[1:]
                 if line.split()[3] == "0A" and line.split()[1].endswith(":7530")}
    assert listening == {"0100007F:7530"}, listening
