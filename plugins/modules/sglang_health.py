#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Wait until an SGLang service answers /health 200, failing early when its unit crashes."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_health
short_description: Wait for an SGLang server to become healthy, or report why it did not
description:
  - Polls C(/health) of an SGLang server until it answers HTTP 200 or O(timeout) passes.
  - Watches the systemd unit at the same time, so a server that crashes during start-up (CUDA out
    of memory, an unknown speculative algorithm, a restart loop) is reported within one poll
    interval instead of after the whole start-up timeout.
  - A C(/health) 200 only proves that the scheduler answers; it is not a quality verdict (see
    M(ansible.legacy.sglang_probe)).
  - Read-only. In check mode it returns at once without polling unless
    O(skip_in_check_mode=false) (the default is V(true)).
version_added: "1.0.0"
author:
  - ddtree-fleet maintainers (!UNKNOWN)
options:
  url:
    description: Base URL of the server, for example V(http://127.0.0.1:30000).
    type: str
    required: true
  unit:
    description: The systemd unit that runs the server; empty to skip unit checks.
    type: str
    default: sglang.service
  timeout:
    description: Seconds to wait for health. Real model loads take minutes.
    type: float
    default: 900
  interval:
    description: Seconds between polls.
    type: float
    default: 1.0
  expect_restarts:
    description:
      - The unit's C(NRestarts) before the wait began; any increase means the server crashed.
      - Leave unset to read it at the start of the wait.
    type: int
  skip_in_check_mode:
    description:
      - In check mode return at once (the service may not exist yet), with RV(healthy=false) and
        RV(state=check_mode), marked C(skipped).
      - Set to V(false) to poll in check mode as in a normal run.
    type: bool
    default: true
attributes:
  check_mode:
    support: partial
    description: Can run in check mode; by default it does not wait there.
    details:
      - With the default O(skip_in_check_mode=true) it returns at once without polling or reading
        the unit; with O(skip_in_check_mode=false) it waits exactly as in a normal run.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to show.
"""

EXAMPLES = r"""
- name: Wait for the new unit to answer /health
  sglang_health:
    url: http://127.0.0.1:30000
    unit: sglang.service
    timeout: 900
  register: health
"""

RETURN = r"""
healthy:
  description: Whether /health answered 200.
  returned: always
  type: bool
  sample: true
elapsed:
  description: Seconds waited.
  returned: always
  type: float
  sample: 4.2
state:
  description:
    - How the wait ended, one of V(healthy), V(crashed), V(failed), V(inactive), V(timeout).
    - V(check_mode) when the wait was skipped in check mode (O(skip_in_check_mode)).
  returned: always
  type: str
  sample: healthy
unit_state:
  description: C(ActiveState), C(SubState), C(NRestarts), C(ExecMainStatus) of the unit at the end.
  returned: when unit is set
  type: dict
  sample: {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "ExecMainStatus": "0"}
last_status:
  description: The last HTTP status of /health (0 when the port refused the connection).
  returned: always
  type: int
  sample: 200
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.fleet.plugins.module_utils.http.client import BadURL, HttpError, get_json, parse_base_url

HEALTH_TIMEOUT = 5.0
PROPS = ("ActiveState", "SubState", "NRestarts", "ExecMainStatus", "Result")


def unit_state(module, systemctl, unit):
    rc, out, _err = module.run_command([systemctl, "show", unit, "-p", ",".join(PROPS)])
    if rc != 0:
        return {}
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def restarts(state):
    return int(state.get("NRestarts", "0") or 0)


def health_status(url):
    """The HTTP status of <url>/health; 0 when no answer came (refused, unreachable, timed out).

    A bad url raises ValueError (http.client.BadURL).
    """
    try:
        return get_json(url, "/health", timeout=HEALTH_TIMEOUT)[0]
    except BadURL:
        raise
    except HttpError:
        return 0


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            unit=dict(type="str", default="sglang.service"),
            timeout=dict(type="float", default=900.0),
            interval=dict(type="float", default=1.0),
            expect_restarts=dict(type="int"),
            skip_in_check_mode=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    unit = p["unit"]
    try:
        parse_base_url(p["url"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    if module.check_mode and p["skip_in_check_mode"]:
        module.exit_json(changed=False, skipped=True, healthy=False, elapsed=0.0,
                         state="check_mode", last_status=0)
    systemctl = module.get_bin_path("systemctl", required=bool(unit))
    t0 = time.time()
    state = unit_state(module, systemctl, unit) if unit else {}
    restarts0 = p["expect_restarts"]
    if restarts0 is None:
        restarts0 = restarts(state)
    end = None
    while True:
        status = health_status(p["url"])
        if status == 200:
            end = "healthy"
        elif unit:
            state = unit_state(module, systemctl, unit)
            if state.get("ActiveState") == "failed":
                end = "failed"
            elif restarts(state) > restarts0 or state.get("SubState") == "auto-restart":
                end = "crashed"
            elif state.get("ActiveState") == "inactive" and time.time() - t0 > 2 * p["interval"]:
                end = "inactive"
        if end or time.time() - t0 >= p["timeout"]:
            break
        time.sleep(p["interval"])
    if unit:
        state = unit_state(module, systemctl, unit)
    end = end or "timeout"
    elapsed = round(time.time() - t0, 2)
    result = dict(changed=False, healthy=end == "healthy", elapsed=elapsed, state=end,
                  last_status=status, unit_state=state)
    if end == "healthy":
        module.exit_json(**result)
    reasons = {"timeout": f"no /health 200 from {p['url']} within {p['timeout']:.0f}s "
                          f"(last status {status})",
               "failed": f"unit {unit} failed before it became healthy",
               "crashed": f"unit {unit} crashed and restarted before it became healthy",
               "inactive": f"unit {unit} is not running"}
    module.fail_json(msg=reasons[end] + f" after {elapsed}s", **result)


if __name__ == "__main__":
    main()
