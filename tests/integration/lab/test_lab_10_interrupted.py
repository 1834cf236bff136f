"""An interrupted deploy: the controller dies between the restart and the verdict.

The host's watchdog (known_good arm/disarm) restores the known-good unit by itself; the next run
takes over the dead run's lock and finishes the job through the gate.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import labkit


def test_controller_killed_mid_change_host_restores_itself_and_next_run_finishes(lab):
    kg = labkit.known_good("ct129")
    assert kg["meta"]["algorithm"] == "NEXTN"
    argv = [str(labkit.VENV_BIN / "ansible-playbook"), "deploy_ddtree.yml", "-l", "ct129",
            "-e", "known_good_watchdog_seconds=20"]
    proc = subprocess.Popen(argv, cwd=labkit.REPO, env=labkit.ansible_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen_restart = False
    out = []
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        if "RUNNING HANDLER [ddtree.fleet.sglang_service : Restart sglang]" in line:
            seen_restart = True
        elif seen_restart and line.startswith("TASK ["):
            os.killpg(proc.pid, signal.SIGKILL)  # the controller dies: no rescue, no handlers
            killed_at = time.monotonic()
            break
    proc.wait(timeout=30)
    assert seen_restart, "".join(out[-40:])
    # Right after the crash the host runs the new, unprobed unit...
    assert labkit.sha256("ct129", labkit.UNIT)[labkit.UNIT] != kg["unit_sha256"]
    # ...until its watchdog fires and restores known-good by itself.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if labkit.sha256("ct129", labkit.UNIT)[labkit.UNIT] == kg["unit_sha256"]:
            break
        time.sleep(1)
    else:
        raise AssertionError("the watchdog did not restore the known-good unit")
    restored_after = time.monotonic() - killed_at
    assert labkit.sha256("ct129", labkit.ENV_FILE)[labkit.ENV_FILE] == kg["env_sha256"]
    # The watchdog logs its line once the restored service is restarted, after the files are back.
    def watchdog_said_so():
        journal = labkit.ssh("ct129", "journalctl -u ddtree-fleet-watchdog --no-pager -o cat").stdout
        return "restored known-good" in journal

    labkit.wait_until(watchdog_said_so, timeout=90, interval=1,
                      what="the watchdog's 'restored known-good' journal line")
    # The restarted known-good service comes up (port closed, then /health) and passes the probe.
    deadline = time.monotonic() + 90
    while True:
        rc, report, _ = labkit.probe("ct129")
        if rc == 0 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert rc == 0, report
    healthy_after = time.monotonic() - killed_at
    assert labkit.known_good("ct129")["link"] == kg["link"]  # the record never moved
    labkit.record_timing("interrupted deploy: watchdog restored known-good", unit_restored_after_kill=restored_after,
                         probed_ok_after_kill=healthy_after)

    # The next run takes over the dead run's lock and finishes the job: the gate decides.
    nxt = labkit.run_playbook("deploy_ddtree.yml", "-l", "ct129")
    assert "took over a stale lock" in nxt.out, nxt
    assert nxt.rc != 0 and "gate" in nxt.out
    assert labkit.sha256("ct129", labkit.UNIT)[labkit.UNIT] == kg["unit_sha256"]
    assert len(labkit.quarantine_files("ct129")) == 1
    labkit.clear_quarantine("ct129")


def test_benchmark_killed_mid_candidate_host_restores_itself(lab):
    """benchmark.yml brings candidates up through the same watchdog as a deploy: killed between a
    candidate's restart and its verdict, it leaves the host restoring known-good by itself."""
    labkit.ensure_seeded("interrupted benchmark")
    host = "ct200"
    kg = labkit.known_good(host)
    evidence_before = set(labkit.ssh(host, f"ls -1d {labkit.STATE_DIR}/evidence/watchdog-* 2>/dev/null || true")
                          .stdout.split())
    argv = [str(labkit.VENV_BIN / "ansible-playbook"), "benchmark.yml", "-l", host,
            "-e", '{"benchmark_candidates": ["DDTREE"], "benchmark_concurrency": [1]}',
            "-e", "benchmark_watchdog_seconds=20"]
    proc = subprocess.Popen(argv, cwd=labkit.REPO, env=labkit.ansible_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen_restart, killed = False, False
    out = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            out.append(line)
            if "RUNNING HANDLER [ddtree.fleet.sglang_service : Restart sglang]" in line:
                seen_restart = True
            elif seen_restart and line.startswith("TASK ["):
                os.killpg(proc.pid, signal.SIGKILL)  # the controller dies mid-candidate
                killed = True
                break
        proc.wait(timeout=30)
        assert killed, "".join(out[-40:])
        # The candidate serves, unproven, right after the crash...
        assert labkit.sha256(host, labkit.UNIT)[labkit.UNIT] != kg["unit_sha256"]
        assert "DDTREE" in labkit.read_text(host, labkit.UNIT)
        # ...until the watchdog the benchmark armed restores known-good.
        labkit.wait_until(lambda: labkit.sha256(host, labkit.UNIT)[labkit.UNIT] == kg["unit_sha256"],
                          timeout=90, interval=1, what="the watchdog restoring the known-good unit")
        assert labkit.sha256(host, labkit.ENV_FILE)[labkit.ENV_FILE] == kg["env_sha256"]
        labkit.wait_until(lambda: "restored known-good" in labkit.ssh(
            host, "journalctl -u ddtree-fleet-watchdog --no-pager -o cat").stdout,
            timeout=90, interval=1, what="the watchdog's 'restored known-good' journal line")
        evidence = set(labkit.ssh(host, f"ls -1d {labkit.STATE_DIR}/evidence/watchdog-*").stdout.split())
        new = sorted(evidence - evidence_before)
        assert len(new) == 1, (evidence_before, evidence)
        change = labkit.read_json(host, f"{new[0]}/change.json")
        assert change["known_good"] == kg["link"].rsplit("/", 1)[-1], change
        labkit.wait_until(lambda: labkit.probe(host)[0] == 0, timeout=90, interval=2,
                          what="the restored known-good service passing the probe")
        assert labkit.known_good(host)["link"] == kg["link"]  # nothing was promoted
        assert not labkit.quarantine_files(host)              # nor quarantined
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        labkit.restore_seeded([host], "interrupted benchmark: drop the dead run's lock and bookkeeping")
