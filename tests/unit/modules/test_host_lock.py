"""The host's run lock (plugins/module_utils/lock.py, plugins/modules/host_lock.py): a lease taken,
renewed and released by compare-and-swap under a flock, raced by real concurrent processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils import lock


def owner(run, **extra):
    return dict({"run": run, "controller": "ops1", "pid": 4242, "playbook": "Deploy"}, **extra)


def on_disk(path):
    return json.loads((path / "owner.json").read_text())


@pytest.fixture
def path(tmp_path):
    return tmp_path / "run" / "lock"


def test_a_free_lock_appears_complete_with_its_lease_and_token(path):
    res = lock.acquire(str(path), owner("r1"), 900, now=1000.0)
    assert res["acquired"] and res["holder"] is None and res["took_over"] is None
    rec = on_disk(path)
    assert rec["run"] == "r1" and rec["heartbeat"] == 1000.0 and rec["lease"] == 900
    assert rec["token"] == res["token"] and len(rec["token"]) == 32
    # Nothing half-written is left beside it (the directory arrived by one rename).
    assert sorted(p.name for p in path.parent.iterdir()) == ["lock", "lock.guard"]
    assert sorted(p.name for p in path.iterdir()) == ["owner.json"]


def test_a_live_holder_is_reported_and_left_alone(path):
    lock.acquire(str(path), owner("r1"), 900, now=1000.0)
    before = (path / "owner.json").read_bytes()
    res = lock.acquire(str(path), owner("r2", controller="ops2"), 900, now=1500.0)
    assert not res["acquired"] and res["took_over"] is None and res["token"] == ""
    assert res["holder"]["run"] == "r1" and res["holder"]["expires_in"] == 400 and res["holder"]["age"] == 500
    assert (path / "owner.json").read_bytes() == before


def test_the_same_run_renews_instead_of_deadlocking_itself(path):
    first = lock.acquire(str(path), owner("r1"), 900, now=1000.0)
    again = lock.acquire(str(path), owner("r1"), 600, now=1200.0)
    assert again["acquired"] and again["token"] == first["token"]
    rec = on_disk(path)
    assert rec["heartbeat"] == 1200.0 and rec["lease"] == 600 and rec["acquired"] == 1000.0


def test_a_lease_that_ran_out_is_taken_over_and_says_whose(path):
    lock.acquire(str(path), owner("dead"), 900, now=1000.0)
    res = lock.acquire(str(path), owner("r2"), 900, now=1901.0)
    assert res["acquired"] and res["took_over"]["run"] == "dead" and res["took_over"]["expires_in"] == -1
    assert on_disk(path)["run"] == "r2"


def test_the_heartbeat_keeps_a_long_stage_its_lock(path):
    """A stage longer than the default lease keeps the lock when the run renewed it with the
    stage's own limit first (the fixed 2 h TTL expired under a long download)."""
    lock.acquire(str(path), owner("r1"), 900, now=1000.0)
    assert lock.renew(str(path), "r1", 7200, now=1100.0)["renewed"]
    res = lock.acquire(str(path), owner("r2"), 900, now=1100.0 + 7000)
    assert not res["acquired"] and res["holder"]["expires_in"] == 200


def test_a_takeover_names_its_holder_by_token_and_never_replaces_a_newer_one(path):
    old = lock.acquire(str(path), owner("dead"), 900, now=1000.0)
    # The caller judged "dead" gone (its PID), but another run took over in between:
    lock.acquire(str(path), owner("fast"), 900, takeover_token=old["token"], now=1001.0)
    late = lock.acquire(str(path), owner("late"), 900, takeover_token=old["token"], now=1002.0)
    assert not late["acquired"] and late["holder"]["run"] == "fast"
    assert on_disk(path)["run"] == "fast"


def test_a_lock_written_before_leases_keeps_its_old_ttl(path):
    path.mkdir(parents=True)
    (path / "owner.json").write_text(json.dumps({"run": "legacy", "epoch": 1000}))
    assert not lock.acquire(str(path), owner("r2"), 900, now=1000.0 + 7000)["acquired"]
    res = lock.acquire(str(path), owner("r2"), 900, now=1000.0 + 7201)
    assert res["acquired"] and res["took_over"]["run"] == "legacy"


def test_a_directory_without_owner_is_stale_only_after_its_grace(path):
    path.mkdir(parents=True)
    now = os.stat(path).st_mtime
    held = lock.acquire(str(path), owner("r2"), 900, now=now + 5)
    assert not held["acquired"] and held["holder"]["broken"]
    res = lock.acquire(str(path), owner("r2"), 900, now=now + lock.BROKEN_GRACE + 1)
    assert res["acquired"] and res["took_over"]["broken"] and on_disk(path)["run"] == "r2"


def test_renew_and_release_refuse_a_run_that_lost_the_lock(path):
    lock.acquire(str(path), owner("r1"), 60, now=1000.0)
    lock.acquire(str(path), owner("r2"), 900, now=1100.0)   # r1's lease ran out: r2 took over
    lost = lock.renew(str(path), "r1", 900, now=1101.0)
    assert not lost["renewed"] and lost["holder"]["run"] == "r2"
    assert not lock.release(str(path), "r1")["released"]
    assert on_disk(path)["run"] == "r2"
    assert lock.release(str(path), "r2")["released"]
    assert not path.exists() and not list(path.parent.glob("lock.old.*"))


def test_check_mode_writes_nothing(path):
    res = lock.acquire(str(path), owner("r1"), 900, check_mode=True)
    assert res["acquired"] and not path.exists()


def test_an_empty_run_id_is_refused(path):
    with pytest.raises(lock.LockError, match="owner.run is empty"):
        lock.acquire(str(path), {"controller": "ops1"}, 900)


def test_a_guard_held_too_long_is_an_error_not_a_hang(path, monkeypatch):
    path.parent.mkdir(parents=True)
    import fcntl
    fd = os.open(str(path) + ".guard", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        # flock(2) locks are per open file description: a second open in this process contends.
        with pytest.raises(lock.LockError, match="cannot take the guard in 0 s"):
            lock.acquire(str(path), owner("r1"), 900, wait=0.2)
    finally:
        os.close(fd)


def _race(args):
    path, run, start, takeover = args
    while time.time() < start:
        time.sleep(0.001)
    return lock.acquire(path, owner(run), 900, takeover_token=takeover)


@pytest.mark.parametrize("held", ["free", "expired", "dead-by-token"])
def test_racing_processes_one_wins(path, held):
    """16 processes start at the same instant on a free lock, an expired one and a dead holder's
    (all naming its token): exactly one holds the lock after, and it is the one on disk."""
    token = ""
    if held != "free":
        token = lock.acquire(str(path), owner("dead"), 60 if held == "expired" else 900, now=time.time() - 120)["token"]
    start = time.time() + 0.5
    with multiprocessing.get_context("fork").Pool(16) as pool:
        results = pool.map(_race, [(str(path), "r%d" % i, start, token if held == "dead-by-token" else "")
                                   for i in range(16)])
    winners = [r for r in results if r["acquired"]]
    assert len(winners) == 1, results
    assert on_disk(path)["token"] == winners[0]["token"]
    losers = [r for r in results if not r["acquired"]]
    assert {r["holder"]["run"] for r in losers if r["holder"]["run"] != "dead"} <= {on_disk(path)["run"]}
    if held != "free":
        assert winners[0]["took_over"]["run"] == "dead"


def test_module_heartbeat_of_a_lost_lock_fails_naming_the_holder(run_module, path):
    lock.acquire(str(path), owner("other", controller="ops2", pid=77), 900)
    res = run_module("host_lock", {"path": str(path), "state": "renewed", "run": "mine", "lease": 600})
    assert res.failed
    msg = res.result["msg"]
    assert "this run (mine) no longer holds the lock" in msg
    assert "held by run other on ops2 (pid 77)" in msg and "stopping before changing anything more" in msg


def test_module_round_trip(run_module, path):
    took = run_module("host_lock", {"path": str(path), "owner": owner("mine"), "lease": 300})
    assert not took.failed and took.result["acquired"] and took.result["changed"] is False
    renewed = run_module("host_lock", {"path": str(path), "state": "renewed", "run": "mine", "lease": 3600})
    assert renewed.result["renewed"] and on_disk(path)["lease"] == 3600
    gone = run_module("host_lock", {"path": str(path), "state": "released", "run": "mine"})
    assert gone.result["released"] and not path.exists()
    bad = run_module("host_lock", {"path": str(path), "owner": owner("mine"), "lease": 0})
    assert bad.failed and "lease=0: expected at least 1 second" in bad.result["msg"]
