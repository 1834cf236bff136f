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


def test_two_runs_racing_for_a_dead_runs_lock_take_it_over_once(lab):
    """A run on this controller died holding ct200's lock (its PID is gone). Two real runs start at
    once: exactly one takes the lock over (by the dead holder's token, under the host's flock);
    the other finds the winner's lock and fails fast naming it, or comes after the winner released
    it. The loser's report says "locked" and whose lock it was."""
    stale = {"controller": subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip(),
             "pid": 999999, "run": "dead-run", "playbook": "Deploy", "since": "2026-01-01T00:00:00Z",
             "heartbeat": int(time.time()), "lease": 3600, "token": "dead-token"}
    labkit.ssh("ct200", "mkdir -p /run/ddtree-fleet/lock && cat > /run/ddtree-fleet/lock/owner.json <<'J'\n"
                        + json.dumps(stale) + "\nJ")
    # Back to NEXTN from the DDTREE the test before promoted: 30% slower on purpose, so the run
    # raises the speed gate's tolerance, as README says an operator does.
    args = ("deploy_ddtree.yml", "-l", "ct200", "-e", "sglang_speculative_algorithm=NEXTN",
            "-e", "quality_gate_max_slowdown=0.5")
    started = time.time()
    racers = [labkit.Background(*args), labkit.Background(*args)]
    runs = [r.wait(600) for r in racers]
    took = [r for r in runs if "took over the lock of Deploy" in r.out]
    assert len(took) == 1, [r.tail() for r in runs]
    assert "pid 999999" in took[0].out and "its process is gone" in took[0].out
    assert took[0].rc == 0, took[0]
    other = runs[1 - runs.index(took[0])]
    assert "took over" not in other.out
    if other.rc != 0:   # it met the winner's lock (the usual case: both start within a second)
        assert "ct200 is locked by another ddtree-fleet run" in other.out, other.tail()
        reports = [json.loads(p.read_text()) for p in (labkit.ARTIFACTS / "deploy").glob("*.json")
                   if p.name != "latest.json" and p.stat().st_mtime >= started]
        locked = [h for rep in reports for h in rep["hosts"] if h["status"] == "locked"]
        assert len(locked) == 1 and locked[0]["outcome"] == "locked", reports
        assert locked[0]["lock_holder"]["pid"] != 999999 and locked[0]["lock_holder"]["run"] != "dead-run"
    assert labkit.ssh("ct200", "test -e /run/ddtree-fleet/lock", check=False).returncode != 0
