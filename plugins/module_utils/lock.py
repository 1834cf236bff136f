# -*- coding: utf-8 -*-
# ddtree-fleet: the host's run lock, as a lease taken and renewed by compare-and-swap.
#
# Used by plugins/modules/host_lock.py on the managed host (standard library only) and by the unit
# tests. The lock is a directory (LOCK) holding owner.json; the host's state read (host_state)
# sees "a run holds the lock" by the directory alone. Every operation runs under an exclusive
# flock(2) on a guard file beside it (LOCK.guard), so reading the holder, judging it and replacing
# it are one step: two runs can never both believe they hold the lock, and a takeover replaces
# only the holder that was judged (its token), never one that arrived in between.
#
# A holder is live while its lease runs: now (the host's clock) - heartbeat <= lease. The run
# renews the lease at each stage with that stage's own limit (a weights download, the gate), so
# no fixed TTL can expire under a long stage and a dead run's lock expires one lease after its
# last heartbeat.

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import time
import uuid

OWNER = "owner.json"
# A lock written before leases (mkdir, then owner.json with "epoch"): its old fixed TTL.
LEGACY_LEASE = 7200
# A lock directory with no readable owner.json: written by a pre-lease run between its mkdir and
# its owner.json, or by hand. Older than this, it is stale (a live writer takes milliseconds).
BROKEN_GRACE = 120
GUARD_WAIT = 30.0


class LockError(Exception):
    """The guard could not be taken, or the lock's files could not be read or written."""


class _Guard:
    """An exclusive flock(2) on LOCK.guard for the length of one operation."""

    def __init__(self, path, wait=GUARD_WAIT, clock=time.monotonic, sleep=time.sleep):
        self.path, self.wait, self.clock, self.sleep = path + ".guard", wait, clock, sleep
        self.fd = None

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o755, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = self.clock() + self.wait
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or self.clock() >= deadline:
                    os.close(self.fd)
                    raise LockError("%s: cannot take the guard in %.0f s: %s" % (self.path, self.wait, exc)) from exc
                self.sleep(0.05)

    def __exit__(self, *exc):
        os.close(self.fd)  # closing releases the flock
        return False


def read_holder(path, now):
    """The lock's holder: None when no run holds it, else its owner record with "broken" (no
    readable owner.json), "lease", "heartbeat", "age" and "expires_in" (seconds; <= 0 when the
    lease has run out) filled in from the host's clock."""
    if not os.path.isdir(path):
        return None
    try:
        with open(os.path.join(path, OWNER), encoding="utf-8") as handle:
            holder = json.load(handle)
        if not isinstance(holder, dict):
            raise ValueError("not an object")
        broken = False
    except (OSError, ValueError):
        holder, broken = {}, True
    if broken:
        heartbeat, lease = os.stat(path).st_mtime, BROKEN_GRACE
    else:
        heartbeat = _number(holder.get("heartbeat"), _number(holder.get("epoch"), 0))
        lease = _number(holder.get("lease"), LEGACY_LEASE)
    holder = dict(holder, broken=broken, heartbeat=heartbeat, lease=lease)
    holder["age"] = int(now - heartbeat)
    holder["expires_in"] = int(heartbeat + lease - now)
    return holder


def _number(value, default):
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _record(owner, lease, now, token=None, acquired=None):
    record = {k: v for k, v in dict(owner).items() if k not in ("broken", "age", "expires_in")}
    record.update(heartbeat=now, lease=int(lease), token=token or uuid.uuid4().hex,
                  acquired=now if acquired is None else acquired)
    return record


def _write_new(path, record):
    """LOCK appears complete, owner.json included, in one rename (never an empty directory)."""
    staging = "%s.new.%s" % (path, record["token"])
    os.mkdir(staging, 0o700)
    _write_owner(staging, record)
    os.rename(staging, path)


def _write_owner(directory, record):
    tmp = os.path.join(directory, OWNER + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(record, handle, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, os.path.join(directory, OWNER))


def _replace(path, record):
    """Swap the holder for this run's record: the directory stays, owner.json is replaced."""
    if not os.path.isdir(path):
        _write_new(path, record)
        return
    _write_owner(path, record)


def _public(holder):
    """The holder as the caller sees it (its token is what a takeover must name)."""
    return None if holder is None else dict(holder, token=holder.get("token", ""))


def acquire(path, owner, lease, takeover_token="", check_mode=False, now=None, wait=GUARD_WAIT):
    """Take the lock for ``owner`` (a dict with at least "run"), or say who holds it.

    Taken when no run holds it, when this run already does (its lease is renewed), when the
    holder's lease has run out (on the host's clock), or when ``takeover_token`` is the holder's
    token (the caller judged that exact holder dead). Returns {"acquired", "holder" (the holder
    found, or None), "took_over" (the holder replaced, or None), "lease", "token"}."""
    run = str(owner.get("run") or "")
    if not run:
        raise LockError("owner.run is empty: every holder needs a run id")
    with _Guard(path, wait):
        now = time.time() if now is None else now
        holder = read_holder(path, now)
        result = {"acquired": False, "holder": _public(holder), "took_over": None, "lease": int(lease), "token": ""}
        if holder is None:
            record = _record(owner, lease, now)
            if not check_mode:
                _write_new(path, record)
        elif holder.get("run") == run:
            record = _record(owner, lease, now, token=holder.get("token"), acquired=holder.get("acquired"))
            if not check_mode:
                _replace(path, record)
        elif holder["expires_in"] <= 0 or (takeover_token and takeover_token == holder.get("token")):
            record = _record(owner, lease, now)
            result["took_over"] = _public(holder)
            if not check_mode:
                _replace(path, record)
        else:
            return result
        result.update(acquired=True, token=record["token"])
        return result


def renew(path, run, lease, check_mode=False, now=None, wait=GUARD_WAIT):
    """The heartbeat: extend this run's lease to ``lease`` seconds from now. Returns {"renewed",
    "holder"}; not renewed when another run holds the lock (it took it over: this run's lease had
    run out) or none does."""
    with _Guard(path, wait):
        now = time.time() if now is None else now
        holder = read_holder(path, now)
        if holder is None or holder.get("run") != run or holder["broken"]:
            return {"renewed": False, "holder": _public(holder), "lease": int(lease)}
        if not check_mode:
            _replace(path, _record(holder, lease, now, token=holder.get("token"), acquired=holder.get("acquired")))
        return {"renewed": True, "holder": _public(holder), "lease": int(lease)}


def release(path, run, check_mode=False, now=None, wait=GUARD_WAIT):
    """Remove the lock if ``run`` holds it. Returns {"released", "holder"}."""
    with _Guard(path, wait):
        now = time.time() if now is None else now
        holder = read_holder(path, now)
        if holder is None or holder.get("run") != run or holder["broken"]:
            return {"released": False, "holder": _public(holder)}
        if not check_mode:
            # Renamed away first, so that the lock vanishes in one step even if removal is slow.
            gone = "%s.old.%s" % (path, uuid.uuid4().hex)
            os.rename(path, gone)
            shutil.rmtree(gone, ignore_errors=True)
        return {"released": True, "holder": _public(holder)}
