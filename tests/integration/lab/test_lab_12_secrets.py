"""Secrets never leak, and the service runs locked down.

Canary secrets (an SGLang API key and an HF token, random per session) come from the
environment, as inventory/production reads them (inventory/lab does the same). Then a --check
--diff run, a change that fails the gate (evidence), a change that passes (a known-good record)
and a drift run; afterwards everything the tool wrote -- play output, artifacts/, .ansible/, the
host's journal and files -- is searched for the canaries. They may live only in the service's
EnvironmentFile, the known-good record's copy of it, the snapshot taken before a change and the
--config file the unit writes for SGLang at each start, all 0600 and owned by the service user.
No process's command line holds the key (/proc/PID/cmdline is readable by every local user).

SGLang itself logs every server argument at start-up, the API key in clear (logger
sglang.srt.entrypoints.engine, ``server_args={...}``), and so does the lab's stand-in. The journal
stays clean only because the unit points SGLang at the role's logging config, which raises that
logger to WARNING; the last tests prove both halves on the host.
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
ADMIN = f"ddtree-canary-admin-{secrets.token_hex(12)}"
CANARIES = (KEY, TOKEN, ADMIN)
# The EnvironmentFile, the known-good record's copy, and the pre-change snapshot of it.
ALLOWED_ON_HOST = re.compile(r"^(/etc/sglang/sglang\.env|/var/lib/ddtree-fleet/records/[0-9a-f]+/env"
                             r"|/var/lib/ddtree-fleet/staging/previous-sglang\.env|/run/sglang/api-key\.yaml)$")
KEY_CONFIG = "/run/sglang/api-key.yaml"
FAULTS_ENV = "/etc/ddtree-lab/faults.env"
LOGGING_CONFIG = "/etc/sglang/sglang-logging.json"
UNIT = "/etc/systemd/system/sglang.service"


@pytest.fixture(scope="module")
def runs(lab):
    """Every play of the scenario, run with the canaries in the environment."""
    labkit.ensure_seeded("secrets")
    env = {"SGLANG_API_KEY": KEY, "HF_TOKEN": TOKEN, "SGLANG_ADMIN_API_KEY": ADMIN}
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


def test_admin_endpoints_take_only_the_admin_key(runs):
    """--admin-api-key from the same 0600 file: the client key no longer swaps weights or flushes."""
    probe = ("import sys, urllib.request, urllib.error\n"
             "keys = dict(line.split('=', 1) for line in sys.stdin.read().split())\n"
             "def post(path, key):\n"
             "    req = urllib.request.Request('http://127.0.0.1:30000' + path, data=b'{}', method='POST',\n"
             "        headers={'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'})\n"
             "    try:\n"
             "        return urllib.request.urlopen(req, timeout=5).status\n"
             "    except urllib.error.HTTPError as e:\n"
             "        return e.code\n"
             "print(post('/flush_cache', keys['client']), post('/update_weights_from_disk', keys['client']),\n"
             "      post('/flush_cache', keys['admin']))\n")
    res = subprocess.run(["ip", "netns", "exec", labkit.netns(HOST), "python3", "-c", probe],
                         input=f"client={KEY} admin={ADMIN}", capture_output=True, text=True, timeout=30)
    assert res.stdout.split() == ["401", "401", "200"], (res.stdout, res.stderr)
    config = labkit.read_text(HOST, KEY_CONFIG)
    assert config == f'admin-api-key: "{ADMIN}"\napi-key: "{KEY}"\n'


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


def test_no_command_line_on_the_host_holds_the_key(runs):
    """The server reads the key from its --config file (0600, the service user's tmpfs RuntimeDirectory)."""
    pid = labkit.ssh(HOST, "systemctl show -p MainPID --value sglang.service").stdout.strip()
    cmdline = labkit.ssh(HOST, f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
    assert f"--config {KEY_CONFIG}" in cmdline and "--api-key" not in cmdline, cmdline
    # A pattern that matches the key without being it: this grep's own command line must not match.
    pattern = f"{KEY[:10]}[{KEY[10]}]{KEY[11:]}"
    hits = labkit.ssh(HOST, f"grep -l -- {shlex.quote(pattern)} /proc/[0-9]*/cmdline 2>/dev/null || true").stdout.split()
    assert not hits, f"command lines holding the key: {hits}"
    ps = labkit.ssh(HOST, "ps -eo args").stdout
    assert KEY not in ps, ps
    assert labkit.ssh(HOST, f"stat -c '%a %U %G' /run/sglang {KEY_CONFIG}").stdout.split() == [
        "700", "sglang", "sglang", "600", "sglang", "sglang"]
    # What systemd made of the unit's ExecStartPre line: the shell reads the variable, not the key.
    pre = labkit.ssh(HOST, "systemctl show -p ExecStartPre sglang.service").stdout
    assert "${SGLANG_API_KEY}" in pre and KEY not in pre, pre


def test_no_canary_in_the_journal(runs):
    for c in CANARIES:
        res = labkit.ssh(HOST, f"journalctl --no-pager -o cat | grep -cF -- {shlex.quote(c)} || true")
        assert res.stdout.strip() == "0", f"the journal holds a canary secret {res.stdout.strip()} times"


def test_the_service_runs_unprivileged_and_hardened(runs):
    lines = labkit.ssh(HOST, (
        "systemctl show sglang.service -p User -p NoNewPrivileges -p CapabilityBoundingSet -p AmbientCapabilities "
        "-p ProtectSystem -p ProtectHome -p PrivateTmp -p DevicePolicy -p DeviceAllow -p MainPID -p UMask "
        "-p ProtectClock -p ProtectKernelLogs -p ProtectHostname -p ProtectProc -p RestrictNamespaces "
        "-p SystemCallArchitectures -p RestrictAddressFamilies -p RemoveIPC")).stdout.splitlines()
    props = dict(line.split("=", 1) for line in lines)
    devices = [line.split("=", 1)[1] for line in lines if line.startswith("DeviceAllow=")]   # one line each
    assert props["User"] == "sglang" and props["NoNewPrivileges"] == "yes", props
    assert props["CapabilityBoundingSet"] == "" and props["AmbientCapabilities"] == "", props
    assert props["ProtectSystem"] == "strict" and props["ProtectHome"] == "yes" and props["PrivateTmp"] == "yes", props
    assert props["DevicePolicy"] == "closed", props
    # By class, so that /dev/nvidia-uvm created by the first CUDA call is covered; no path entries.
    # (ProtectClock=yes adds the read-only RTC class)
    assert sorted(devices) == ["char-nvidia-caps rw", "char-nvidia-frontend rw", "char-nvidia-uvm rw",
                               "char-nvidiactl rw", "char-rtc r"], devices
    assert props["UMask"] == "0077" and props["ProtectClock"] == "yes" and props["ProtectKernelLogs"] == "yes", props
    assert props["ProtectHostname"] == "yes" and props["ProtectProc"] == "invisible", props
    assert props["RestrictNamespaces"] == "yes" and props["SystemCallArchitectures"] == "native", props
    assert set(props["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}, props
    assert props["RemoveIPC"] == "yes", props
    # systemd's own exposure score of the unit as it runs (5.0 with the hardening before).
    score = re.search(r"Overall exposure level for sglang.service: ([0-9.]+)",
                      labkit.ssh(HOST, "systemd-analyze security --no-pager sglang.service").stdout)
    print(f"systemd-analyze security sglang.service: {score.group(1)}")
    assert float(score.group(1)) < 5.0, score.group(0)
    status = labkit.read_text(HOST, f"/proc/{props['MainPID']}/status")
    uid = re.search(r"^Uid:\s+(\d+)", status, re.M).group(1)
    caps = re.search(r"^CapEff:\s+(\w+)", status, re.M).group(1)
    assert uid != "0" and int(caps, 16) == 0, (uid, caps)
    # It listens only on the configured address (127.0.0.1:30000 = 0100007F:7530 in /proc/net/tcp).
    listening = {line.split()[1] for line in labkit.read_text(HOST, "/proc/net/tcp").splitlines()[1:]
                 + labkit.read_text(HOST, "/proc/net/tcp6").splitlines()[1:]
                 if line.split()[3] == "0A" and line.split()[1].endswith(":7530")}
    assert listening == {"0100007F:7530"}, listening


def test_the_unit_points_sglang_at_the_logging_config(runs):
    assert labkit.ssh(HOST, f"stat -c '%a %U %G' {LOGGING_CONFIG}").stdout.split() == ["644", "root", "root"]
    doc = json.loads(labkit.read_text(HOST, LOGGING_CONFIG))
    assert doc["disable_existing_loggers"] is False
    assert doc["loggers"]["sglang.srt.entrypoints.engine"]["level"] == "WARNING"
    env = labkit.ssh(HOST, "systemctl show sglang.service -p Environment").stdout
    assert f"SGLANG_LOGGING_CONFIG_PATH={LOGGING_CONFIG}" in env, env
    # The known-good record keeps it with the unit and the EnvironmentFile.
    kg = labkit.known_good(HOST)
    assert kg["meta"].get("logging_sha256") == labkit.sha256(
        HOST, f"{labkit.STATE_DIR}/known-good/logging")[f"{labkit.STATE_DIR}/known-good/logging"], kg


def start_standin_once(marker: str, logging_config: bool) -> str:
    """The host's own stand-in (the service's venv and user), started once with a key that is not a
    canary and stopped right after it logged its arguments (lab fault exit_on_start); its journal."""
    unit = f"ddtree-logcheck-{secrets.token_hex(4)}"
    python = re.search(r"^ExecStart=(\S+) ", labkit.read_text(HOST, UNIT), re.M).group(1)
    assert python.endswith("/bin/python"), python
    setenv = f"-E SGLANG_LOGGING_CONFIG_PATH={LOGGING_CONFIG}" if logging_config else ""
    # --description: systemd's own "Started ..." line would otherwise show the command line.
    labkit.ssh(HOST, f"systemd-run --quiet --wait --collect --unit={unit} --description={unit} "
                     f"-p User=sglang -p Group=sglang "
                     f"-E DDTREE_LAB_FAULT=exit_on_start {setenv} {python} -m sglang_lab_standin "
                     f"--model-path /nonexistent --port 1 --api-key {marker} || true", timeout=60)

    def journal():
        out = labkit.ssh(HOST, f"journalctl --no-pager -o cat -u {unit} _TRANSPORT=stdout").stdout
        return out if "exit_on_start" in out else None
    return labkit.wait_until(journal, 30, what=f"{unit}'s journal")


def test_without_the_logging_config_the_key_would_be_in_the_journal(runs):
    """The canary check above means something: the stand-in on the host logs its arguments like
    SGLang (key in clear) unless the role's logging config is in force."""
    marker = f"ddtree-logcheck-{secrets.token_hex(8)}"
    journal = start_standin_once(marker, logging_config=False)
    line = next((x for x in journal.splitlines() if "server_args={" in x), None)
    assert line is not None, f"the stand-in did not log its arguments like SGLang:\n{journal}"
    assert re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] server_args=\{'model_path': ", line), line
    assert f"'api_key': '{marker}'" in line
    marker = f"ddtree-logcheck-{secrets.token_hex(8)}"
    journal = start_standin_once(marker, logging_config=True)
    assert marker not in journal and "server_args=" not in journal, journal
