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
    evidence_before = labkit.watchdog_evidence("ct129")
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
    # The host's watchdog restores known-good by itself; its evidence keeps the unit it replaced:
    # the new, unprobed DDTREE candidate the dead run had started.
    ev = labkit.watchdog_restored("ct129", evidence_before, kg["unit_sha256"])
    replaced = labkit.read_text("ct129", f"{ev}/unit")
    assert "DDTREE" in replaced and replaced != labkit.read_text("ct129", labkit.UNIT), ev
    restored_after = time.monotonic() - killed_at
    assert labkit.sha256("ct129", labkit.ENV_FILE)[labkit.ENV_FILE] == kg["env_sha256"]
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
    assert "took over the lock of" in nxt.out and "its process is gone" in nxt.out, nxt
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
    evidence_before = labkit.watchdog_evidence(host)
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
        # The watchdog the benchmark armed restores known-good; its evidence keeps the DDTREE
        # candidate it replaced and the change record naming the known-good it went back to.
        ev = labkit.watchdog_restored(host, evidence_before, kg["unit_sha256"])
        assert "DDTREE" in labkit.read_text(host, f"{ev}/unit"), ev
        assert labkit.sha256(host, labkit.ENV_FILE)[labkit.ENV_FILE] == kg["env_sha256"]
        change = labkit.read_json(host, f"{ev}/change.json")
        assert change["known_good"] == kg["link"].rsplit("/", 1)[-1], change
        labkit.wait_until(lambda: labkit.probe(host)[0] == 0, timeout=90, interval=2,
                          what="the restored known-good service passing the probe")
        assert labkit.known_good(host)["link"] == kg["link"]  # nothing was promoted
        assert not labkit.quarantine_files(host)              # nor quarantined
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        labkit.restore_seeded([host], "interrupted benchmark: drop the dead run's lock and bookkeeping")


def test_a_watchdog_shorter_than_the_gate_restores_but_quarantines_nothing(lab):
    """A watchdog that fires while the gate still runs (here: 10 s against a 20 s soak) puts
    known-good back under a candidate nobody has judged. The run fails and says so; the candidate is
    not quarantined (a later run gates it again) and known-good's record is untouched. The default
    watchdog (start-up + the gate's worst case) cannot fire mid-gate."""
    labkit.ensure_seeded("watchdog shorter than the gate")
    host = "ct200"
    kg = labkit.known_good(host)
    evidence_before = labkit.watchdog_evidence(host)
    short = labkit.run_playbook("deploy_ddtree.yml", "-l", host, "-e", "known_good_watchdog_seconds=10",
                                "-e", "quality_gate_soak_seconds=20")
    assert short.rc == 2, short
    assert "was not judged and is not quarantined" in short.out, short.tail()
    ev = labkit.watchdog_restored(host, evidence_before, kg["unit_sha256"])
    assert "DDTREE" in labkit.read_text(host, f"{ev}/unit")
    assert labkit.quarantine_files(host) == []
    after = labkit.known_good(host)
    assert after["link"] == kg["link"] and after["unit_sha256"] == kg["unit_sha256"]
    assert labkit.sha256(host, labkit.UNIT)[labkit.UNIT] == kg["unit_sha256"]
    # The host is back on its seeded known-good: nothing to restore for the next test.
    assert labkit.known_good(host)["meta"]["algorithm"] == "NEXTN"
