"""Fleet-safe rollouts: canary first with a failure budget, and the per-host lock."""
from __future__ import annotations

import json
import subprocess
import time

import labkit


def test_failed_canary_leaves_every_other_host_untouched(lab):
    before = labkit.snapshot("ct200")
    run = labkit.run_playbook("deploy_ddtree.yml", "-e", "ddtree_canary=ct129", "-e", "ddtree_max_fail_percentage=0")
    assert run.rc != 0, run
    assert labkit.snapshot_diff(before, labkit.snapshot("ct200")) == ""  # not even the venv
    report = json.loads((labkit.ARTIFACTS / "deploy" / "latest.json").read_text())
    outcome = {h["host"]: h["outcome"] for h in report["hosts"]}
    assert outcome == {"ct129": "rolled_back", "ct200": "skipped"}, report
    assert labkit.known_good("ct129")["meta"]["algorithm"] == "NEXTN"
    labkit.clear_quarantine("ct129")
    labkit.record_timing("canary ct129 failed, ct200 untouched", play_wall=run.seconds)


def test_second_concurrent_deploy_fails_fast_naming_the_holder(lab):
    first = labkit.Background("deploy_ddtree.yml", "-l", "ct200")   # its output goes to its own log
    try:
        labkit.wait_until(lambda: first.proc.poll() is not None
                          or labkit.ssh("ct200", "test -f /run/ddtree-fleet/lock/owner.json",
                                        check=False).returncode == 0, 120, what="the first deploy holding the lock")
    except AssertionError:
        first.proc.kill()
        raise
    assert first.proc.poll() is None, f"the first deploy ended before it was seen holding the lock: {first.wait()}"
    owner = labkit.read_json("ct200", "/run/ddtree-fleet/lock/owner.json")
    second = labkit.run_playbook("deploy_ddtree.yml", "-l", "ct200")
    first_run = first.wait(900)
    assert first_run.rc == 0, first_run
    assert second.rc != 0, second
    assert "ct200 is locked by another ddtree-fleet run" in second.out
    assert f"pid {owner['pid']}" in second.out
    assert second.seconds < 60, second.seconds
    assert labkit.ssh("ct200", "test -e /run/ddtree-fleet/lock", check=False).returncode != 0  # released
    labkit.record_timing("concurrent deploy refused", second_run_wall=second.seconds)


def test_stale_lock_of_a_dead_run_is_taken_over(lab):
    stale = {"controller": subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip(),
             "pid": 999999, "run": "dead-run", "playbook": "Deploy", "since": "2026-01-01T00:00:00Z",
             "epoch": int(time.time())}
    labkit.ssh("ct200", "mkdir -p /run/ddtree-fleet/lock && cat > /run/ddtree-fleet/lock/owner.json <<'J'\n"
                        + json.dumps(stale) + "\nJ")
    run = labkit.run_playbook("deploy_ddtree.yml", "-l", "ct200", "-e", "sglang_speculative_algorithm=NEXTN")
    assert run.rc == 0, run
    assert "took over a stale lock" in run.out and "pid 999999" in run.out
    assert labkit.ssh("ct200", "test -e /run/ddtree-fleet/lock", check=False).returncode != 0
