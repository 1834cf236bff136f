#!/usr/bin/python
# -*- coding: utf-8 -*-
# ddtree-fleet: take, renew and release the host's run lock (a lease, by compare-and-swap).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_lock
short_description: Take, renew or release the host's ddtree-fleet run lock (a lease, compare-and-swap)
description:
  - One deploy, drift or benchmark run per host at a time. The lock is a directory holding
    C(owner.json) (controller, PID, run id, playbook, heartbeat, lease, token); it appears complete
    in one rename, never as an empty directory.
  - Every operation holds an exclusive C(flock) on C(PATH.guard) while it reads the holder, judges it
    and writes, so two runs never both hold the lock, and a takeover replaces only the holder it
    names (its token), never one that took the lock in between.
  - A holder is live while its lease runs on the host's clock (now - heartbeat <= lease). The run
    renews its lease (O(state=renewed)) before each stage with that stage's own limit; a run that
    died stops renewing, and its lock expires one lease after its last heartbeat.
  - Bookkeeping of runs, not of the host's configuration - never reports a change.
options:
  path:
    description: The lock directory (on tmpfs, so that a reboot clears it).
    type: path
    required: true
  state:
    description:
      - V(acquired) takes the lock, renews it if this run holds it, takes it over when the holder's lease has
        run out or when O(takeover_token) is the holder's token; otherwise returns the holder with RV(acquired=false).
      - V(renewed) extends this run's lease (the heartbeat); fails when this run no longer holds the lock.
      - V(released) removes the lock when this run holds it.
    type: str
    choices: [acquired, renewed, released]
    default: acquired
  owner:
    description:
      - Who takes the lock (V(acquired)), stored in C(owner.json). C(run) is required and names the run;
        C(controller), C(pid), C(pid_started), C(playbook), C(since) are what a contended run reports.
    type: dict
    default: {}
  run:
    description: The run id of this run (V(renewed), V(released); defaults to C(owner.run)).
    type: str
  lease:
    description: Seconds the lock stays this run's without another heartbeat.
    type: int
    default: 900
  takeover_token:
    description:
      - The token of a holder the caller judged dead (its PID is gone on the controller it names);
        only that holder is replaced.
    type: str
    default: ""
  wait:
    description: Seconds to wait for the guard (another run's operation takes milliseconds).
    type: float
    default: 30
attributes:
  check_mode:
    support: full
    description: Reads the holder and answers as it would, writing nothing.
  diff_mode:
    support: none
    description: Run bookkeeping; there is no configuration to show.
notes:
  - Standard library only (fcntl), like every module of the collection on the host.
author:
  - ddtree-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Take the lock for this run
  ddtree.fleet.host_lock:
    path: /run/ddtree-fleet/lock
    owner: {run: 20261207T071000Z-4242, controller: ops1, pid: 4242, playbook: Deploy}
    lease: 900
  register: lock

- name: Heartbeat before a long stage
  ddtree.fleet.host_lock:
    path: /run/ddtree-fleet/lock
    state: renewed
    run: 20261207T071000Z-4242
    lease: 3600

- name: Release it
  ddtree.fleet.host_lock:
    path: /run/ddtree-fleet/lock
    state: released
    run: 20261207T071000Z-4242
"""

RETURN = r"""
acquired:
  description: This run holds the lock now (V(acquired)).
  returned: state is acquired
  type: bool
renewed:
  description: The lease was extended (V(renewed)).
  returned: state is renewed
  type: bool
released:
  description: The lock was removed (V(released)); false when another run or none held it.
  returned: state is released
  type: bool
holder:
  description:
    - The holder found before this operation (null when none), with C(heartbeat), C(lease), C(age),
      C(expires_in) (seconds of lease left, on the host's clock), C(broken) and C(token).
  returned: always
  type: dict
  sample: {run: 20261207T071000Z-4242, controller: ops1, pid: 4242, lease: 900, expires_in: 611, token: 3f2a...}
took_over:
  description: The holder this run replaced (its lease had run out, or its token was named), or null.
  returned: state is acquired
  type: dict
lease:
  description: The lease this run holds, in seconds.
  returned: always
  type: int
token:
  description: This run's token (V(acquired)); empty when not acquired.
  returned: state is acquired
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddtree.fleet.plugins.module_utils.lock import LockError, acquire, release, renew


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", default="acquired", choices=["acquired", "renewed", "released"]),
            owner=dict(type="dict", default={}),
            run=dict(type="str"),
            lease=dict(type="int", default=900),
            takeover_token=dict(type="str", default="", no_log=False),
            wait=dict(type="float", default=30),
        ),
        supports_check_mode=True,
    )
    p = module.params
    run = p["run"] or str((p["owner"] or {}).get("run") or "")
    if p["lease"] < 1:
        module.fail_json(msg="lease=%d: expected at least 1 second" % p["lease"])
    try:
        if p["state"] == "acquired":
            result = acquire(p["path"], dict(p["owner"], run=run), p["lease"], p["takeover_token"],
                             check_mode=module.check_mode, wait=p["wait"])
        elif p["state"] == "renewed":
            result = renew(p["path"], run, p["lease"], check_mode=module.check_mode, wait=p["wait"])
            if not result["renewed"]:
                holder = result["holder"] or {}
                module.fail_json(
                    msg="%s: this run (%s) no longer holds the lock: %s. Its lease ran out and another run took "
                        "over, or the lock was removed; stopping before changing anything more."
                        % (p["path"], run, "held by run %s on %s (pid %s)" % (
                            holder.get("run", "?"), holder.get("controller", "?"), holder.get("pid", "?"))
                            if holder else "no run holds it"), **result)
        else:
            result = release(p["path"], run, check_mode=module.check_mode, wait=p["wait"])
    except (LockError, OSError) as exc:
        module.fail_json(msg="%s: %s" % (p["path"], exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
